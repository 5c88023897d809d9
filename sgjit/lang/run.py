"""Starting one run of a program: the root executor (with a compiled plan's prefix-reusing encoder
and protected sequence where the backend compiles), the state, and the driver that feeds it either
a plan or the program's own Python body. `Function.run` and the server's plan routes share it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sgjit.compiler.plan import GraphPlan
from sgjit.lang.backend import Backend
from sgjit.lang.defaults import RunDefaults
from sgjit.lang.executor import ProgramExecutor
from sgjit.lang.plan_walk import run_plan
from sgjit.lang.scope import program_scope
from sgjit.lang.state import ProgramState, RunHandle
from sgjit.lang.stream import EventLog


def start_run(
    backend: Backend,
    defaults: RunDefaults,
    stream: bool,
    plan: GraphPlan | None = None,
    values: Mapping[str, str] | None = None,
    body: Callable[[ProgramState], Any] | None = None,
    name: str = "program",
) -> ProgramState:
    """Run `plan` with `values`, or the interpreted `body(state)`; with `stream` return at once."""
    compile_plan = getattr(backend, "compile", None)
    compiled = compile_plan(plan) if plan is not None and compile_plan is not None else None
    events = EventLog() if stream else None
    if compiled is not None:
        root = ProgramExecutor(backend, defaults, backend.open_sequence(protected=True), events=events,
                               encoder=compiled.encode)  # fmt: skip
    else:
        root = ProgramExecutor(backend, defaults, backend.open_sequence(), events=events)
    run = RunHandle(events) if events is not None else None
    state = ProgramState(root, plan_hash=plan.plan_hash if plan is not None else None, run=run)

    def drive() -> None:
        error: BaseException | None = None
        try:
            if plan is not None:
                run_plan(plan, values or {}, root)
            elif body is not None:
                with program_scope():
                    state.ret_value = body(state)
        except BaseException as e:  # noqa: BLE001 - re-raised to the caller below
            error = e
        root.close(discard=error is not None)
        try:
            root.sync()
        except BaseException as e:  # noqa: BLE001
            error = error or e
        if run is not None:
            run.error = error
            run.events.close(error)
            run.finish()
        elif error is not None:
            raise error

    if run is None:
        drive()
    else:
        run.driver = threading.Thread(target=drive, name=f"sgjit-run-{name}", daemon=True)
        run.driver.start()
    return state
