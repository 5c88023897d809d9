"""`TPGroup`: a tensor-parallel group's ranks and its two process groups: the device group, where the
model's all-reduces and all-gathers run (NCCL on GPUs, gloo on CPUs), and a gloo control group for
rank 0's step messages. Every collective of a step waits at most SGJIT_TP_TIMEOUT seconds for the
other ranks (sending a step included: gloo's send waits for its receiver); only the other ranks'
wait for the next step is unbounded, as a runtime may idle for days. At tp=1 there is no process group and every collective
returns its input, so the single-device path runs exactly the calls it ran before.

Once a collective fails (a rank died or timed out) the group is broken for good: the ranks may be
anywhere in a step, so every later collective raises the same `TensorParallelError` at once rather
than pairing up with the wrong partner."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sgjit.errors import TensorParallelError

log = logging.getLogger(__name__)

# How long the other ranks wait for rank 0's next step message: a server may idle for days. A rank 0
# that dies closes its sockets, which ends the wait at once.
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(slots=True, eq=False)
class TPGroup:
    rank: int = 0
    size: int = 1
    local_rank: int = 0  # the rank's index on its host (its GPU there)
    local_size: int = 1  # ranks on this host (they share its CPU cores)
    timeout: timedelta = timedelta(seconds=180)  # of a step's collectives
    device_group: Any = None
    control_group: Any = None
    failure: TensorParallelError | None = None
    # called once when the group breaks, where this process started the other ranks: stops them and
    # says what it knows of why (which rank died, its exit code and error)
    on_break: Callable[[], str] | None = None
    stopping: bool = False  # rank 0 told the others to stop: their exits are expected
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def join(
        cls, rank: int, size: int, local_rank: int, local_size: int, store: Any, device: torch.device,
        timeout: float,
    ) -> TPGroup:  # fmt: skip
        """Join the group (every rank calls this with its own rank; it returns once all have): NCCL
        between GPUs, gloo between CPU processes."""
        if device.type == "cuda" and device.index is not None:  # `cuda` alone: the current device
            torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=size,
            timeout=timedelta(seconds=timeout),
        )  # fmt: skip
        control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        return cls(rank, size, local_rank, local_size, timedelta(seconds=timeout), dist.group.WORLD, control)

    # ----- the model's collectives (device group) -----
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place."""
        if self.size > 1:
            self._run(dist.all_reduce, x, group=self.device_group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` side by side along the last dimension, rank 0 first."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._run(dist.all_gather, parts, x, group=self.device_group)
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place."""
        if self.size > 1:
            self._run(dist.broadcast, x, 0, group=self.device_group)
        return x

    # ----- control group (gloo, host tensors) -----
    def control_broadcast(self, x: torch.Tensor, idle: bool = False) -> torch.Tensor:
        """Rank 0's host tensor on every rank; `idle`: a rank's wait for the next step, unbounded."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = IDLE_TIMEOUT if idle else self.timeout
        self._run(lambda: self.control_group.broadcast([x], opts).wait())
        return x

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's `value` (sizes the ranks must share, such as the KV pages); at
        load, so it waits as long as the slowest rank takes to load."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        self._run(dist.all_reduce, t, op=dist.ReduceOp.MIN, group=self.control_group)
        return int(t.item())

    # ----- failure and shutdown -----
    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def fail(self, cause: object) -> TensorParallelError:
        """Mark the group broken, with what is known of why; returns the error to raise."""
        with self._lock:  # the engine thread and the launcher's watcher may both see the break
            if self.failure is None:
                detail = self.on_break() if self.on_break is not None else ""
                self.failure = TensorParallelError(
                    f"the tensor-parallel group of {self.size} ranks broke at rank {self.rank} ({cause})"
                    f"{'; ' + detail if detail else ''}; restart the runtime"
                )
                log.error("%s", self.failure)
            return self.failure

    def _run(self, collective: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.check()
        try:
            collective(*args, **kwargs)
        except RuntimeError as e:  # gloo / NCCL errors: a peer closed its socket or timed out
            raise self.fail(str(e).splitlines()[0][:300]) from e

    def close(self) -> None:
        """Leave the process groups (after the last collective)."""
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def abort(self) -> None:
        """Unblock collectives stuck waiting on a dead rank (NCCL; a gloo peer's death ends them at
        once). NOTE: written for GPUs, not yet run on one."""
        if self.size == 1 or not dist.is_initialized():
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None and dist.get_backend(self.device_group) == "nccl":
            try:
                abort(self.device_group)
            except RuntimeError as e:
                log.warning("could not abort the NCCL group: %s", e)
