"""`ServerState`: what every route reads — the runtime once it has loaded, the server's phase, the
request groups in flight (the drain waits on them) and the metrics. The HTTP socket opens before
the model has loaded, so routes must cope with there being no runtime yet."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Request

from sgjit.lang.runtime_backend import RuntimeBackend
from sgjit.server.args import ServerArgs
from sgjit.server.errors import unavailable
from sgjit.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from sgjit.compiler.plan import GraphPlan
    from sgjit.runtime.runtime import Runtime


class InFlight(Protocol):
    """Work one HTTP call started (a `RequestGroup`, a plan route's `PlanRuns`): the drain waits for
    it to leave `ServerState.groups` and aborts it at the deadline."""

    def abort(self) -> None: ...


class Phase(enum.Enum):
    """The server's life: loading the model (503), serving, or draining after SIGTERM (503)."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


@dataclass(eq=False)
class ServerState:
    args: ServerArgs
    runtime: Runtime | None = None
    phase: Phase = Phase.STARTING
    groups: set[InFlight] = field(default_factory=set)  # in flight (a stream until its last byte)
    plans: dict[str, GraphPlan] = field(default_factory=dict)  # registered through POST /plans, by hash
    started_at: float = field(default_factory=time.time)
    metrics: ServerMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.stats, lambda: self.model_name)
        if self.runtime is not None:
            self.phase = Phase.READY

    def set_ready(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.phase = Phase.READY

    def begin_drain(self) -> None:
        self.phase = Phase.DRAINING

    def abort_in_flight(self) -> None:
        """End every request still running: each stream then closes with an error event."""
        for group in list(self.groups):
            group.abort()

    @property
    def model_name(self) -> str:
        return self.args.served_model_name or self.loaded().model_config.name

    def loaded(self) -> Runtime:
        """The runtime, for routes that only read from it (they keep working while draining)."""
        if self.runtime is None:
            raise unavailable("the server is starting: the model is still loading", "starting")
        return self.runtime

    def accepting(self) -> Runtime:
        """The runtime, for routes that start new work: refused while starting or draining."""
        runtime = self.loaded()
        if self.phase is Phase.DRAINING:
            raise unavailable("the server is shutting down and takes no new requests", "draining")
        return runtime

    def stats(self) -> dict[str, Any] | None:
        """The engine's counters and, with the plan JIT on, the JIT's."""
        if self.runtime is None:
            return None
        return {**self.runtime.stats(), **RuntimeBackend.of(self.runtime).jit_counters()}


def server_state(request: Request) -> ServerState:
    return request.app.state.sgjit


async def accepting_runtime(request: Request) -> Runtime:
    """FastAPI dependency of every route that submits work to the engine (async: no thread hop)."""
    return server_state(request).accepting()
