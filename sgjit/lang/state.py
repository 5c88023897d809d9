"""`ProgramState`: the `s` a program function receives. `s += ...` checks the new nodes against the
program's rules (so an ill-formed program fails at its own line) and hands them to a sink: an
executor when the program runs, a recorder when it is being traced. Reads (`s["x"]`, `s.text()`)
wait for the steps before them."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from sgjit.compiler.nodes import JOIN_MODES, Node, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd
from sgjit.compiler.plan_check import ProgramChecker
from sgjit.errors import ProgramError
from sgjit.lang import primitives
from sgjit.lang.expr import Expr, as_nodes
from sgjit.lang.stream import EventLog


class ProgramSink(Protocol):
    """Where a state's nodes go: `ProgramExecutor` (running) or the tracer's recorder."""

    def append(self, node: Node) -> None: ...
    def fork(self, n: int) -> list[Any]: ...
    def join(self, children: list[Any], mode: str) -> None: ...
    def sync(self) -> None: ...
    def read_var(self, name: str) -> Any: ...
    def read_meta(self, name: str) -> Any: ...
    def read_text(self) -> str: ...
    def read_messages(self) -> list[dict[str, str]]: ...
    def read_variables(self) -> dict[str, Any]: ...
    def write_var(self, name: str, value: Any) -> None: ...


class RunHandle:
    """How a state started by a streaming run knows when its program has finished."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.driver: threading.Thread | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """`fn()` once the program has finished (at once if it has), on the driver's thread: lets an
        event loop await a run without a thread blocked on `finished`."""
        with self._lock:
            if not self.finished.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def finish(self) -> None:
        with self._lock:
            self.finished.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def wait(self) -> None:
        """Outside the program, a streaming state's values are read once the program has finished."""
        if threading.current_thread() is not self.driver:
            self.finished.wait()
            if self.error is not None:
                raise self.error


class ProgramState:
    def __init__(
        self,
        sink: ProgramSink,
        checker: ProgramChecker | None = None,
        *,
        plan_hash: str | None = None,
        run: RunHandle | None = None,
    ) -> None:
        self._sink = sink
        self._checker = checker or ProgramChecker()
        self._run = run
        self._joined = False
        self.plan_hash = plan_hash  # the plan this run executed; None when interpreted
        self.ret_value: Any = None  # what the program function returned (interpreted runs)

    # ----- building the program -----
    def __iadd__(self, other: Any) -> ProgramState:
        nodes = as_nodes(other)
        self._extend(nodes)
        return self

    def _extend(self, nodes: tuple[Node, ...]) -> None:
        if self._joined:
            raise ProgramError("this fork was joined; add to the parent state instead")
        for node in nodes:
            self._checker.feed(node)
        for node in nodes:
            self._sink.append(node)

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """`size` copies of this program that continue separately from here, sharing its prefix."""
        n = operator.index(size)
        if n < 1:
            raise ProgramError(f"fork() needs at least one branch, got {n}")
        children = self._sink.fork(n)
        return ProgramStateGroup(self, [ProgramState(c, self._checker.branch()) for c in children])

    def copy(self) -> ProgramState:
        """One branch of this program that continues separately (`fork(1)[0]`)."""
        return self.fork(1)[0]

    def _join(self, group: ProgramStateGroup, mode: str) -> None:
        if mode not in JOIN_MODES:
            raise ProgramError(f"unknown join mode {mode!r}; use one of {', '.join(JOIN_MODES)}")
        if mode == "gather_variable":
            self._checker.join([s._checker for s in group.states])
        for s in group.states:
            s._joined = True
        self._sink.join([s._sink for s in group.states], mode)

    def var_scope(self, name: str) -> Block:
        """`with s.var_scope(name):` — everything appended inside also becomes variable `name`."""
        return Block(self, (VarScopeBegin(name),), (VarScopeEnd(name),))

    def system(self, expr: Any = None) -> Block | None:
        """`s.system(expr)` appends a system message; `with s.system():` wraps a block in one."""
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Block | None:
        """`s.user(expr)` appends a user message; `with s.user():` wraps a block in one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Block | None:
        """`s.assistant(expr)` appends an assistant message; `with s.assistant():` wraps a block."""
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> Block | None:
        if expr is None:
            return Block(self, (RoleBegin(role),), (RoleEnd(role),))
        self._extend(primitives.role(role, expr).nodes)
        return None

    # ----- reading it -----
    def run_handle(self) -> RunHandle | None:
        """How to learn when a streaming run has finished (None for a run that had finished on return)."""
        return self._run

    def _ready(self) -> ProgramSink:
        if self._run is not None:
            self._run.wait()
        return self._sink

    def __getitem__(self, name: str) -> Any:
        return self._ready().read_var(name)

    def get_var(self, name: str) -> Any:
        return self[name]

    def __contains__(self, name: str) -> bool:
        try:
            self[name]
        except ProgramError:
            return False
        return True

    def get_meta_info(self, name: str) -> Any:
        """What the engine reported for variable `name`: finish reason, token counts, logprobs (for
        a select: each choice's score and token logprobs)."""
        return self._ready().read_meta(name)

    def text(self) -> str:
        return self._ready().read_text()

    def variables(self) -> dict[str, Any]:
        """Every variable the program has set, by name (a copy)."""
        return self._ready().read_variables()

    def messages(self) -> list[dict[str, str]]:
        """The roles so far as an OpenAI message list (the template's default system prompt is not
        one of them)."""
        return self._ready().read_messages()

    def sync(self) -> None:
        self._ready().sync()

    def text_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> Iterator[Any]:
        """The program's text as it is generated (only variable `var_name`'s when given); with
        `return_meta_data`, (text, meta info) pairs, the meta info of a gen's chunk as SGLang streams
        it. Without `stream=True` the run has finished, and this yields the whole text (or value)
        once."""
        if self._run is not None:
            for text, meta in self._run.events.iter(var_name):
                yield (text, meta or {}) if return_meta_data else text
            return
        value = self.text() if var_name is None else self[var_name]
        meta = (self.get_meta_info(var_name) or {}) if var_name is not None else {}
        yield (value, meta) if return_meta_data else value

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code: waits for each piece on a worker thread."""
        pieces = self.text_iter(var_name, return_meta_data)
        loop = asyncio.get_running_loop()
        end = object()
        while (item := await loop.run_in_executor(None, next, pieces, end)) is not end:
            yield item

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def set_var(self, name: str, value: Any) -> None:
        """Set variable `name` of a program that has run (SGLang's `state[name] = value`), e.g. to
        keep a value parsed from generated text."""
        self._ready().write_var(name, value)

    def error(self) -> BaseException | None:
        """The exception that stopped the program, or None (reading a variable raises it too)."""
        try:
            self.sync()
        except Exception as e:  # noqa: BLE001 - returned, as SGLang's state.error() does
            return e
        return None

    def __repr__(self) -> str:
        return f"ProgramState(plan_hash={self.plan_hash!r})"


class Block:
    """A `with` block that opens with some nodes and closes with others. A plain class, not
    contextlib: a traced program may call only sgjit and its own code."""

    __slots__ = ("state", "begin", "end")

    def __init__(self, state: ProgramState, begin: tuple[Node, ...], end: tuple[Node, ...]) -> None:
        self.state, self.begin, self.end = state, begin, end

    def __enter__(self) -> None:
        self.state._extend(self.begin)

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:  # a failing block leaves the program failing; do not close over it
            self.state._extend(self.end)


class ProgramStateGroup:
    """The branches of `s.fork(n)`: extend them together (`forks += expr`, `forks += lambda i: ...`,
    `forks += [one, per, branch]`) or one by one (`forks[i] += ...`), then `forks.join()`."""

    def __init__(self, parent: ProgramState, states: list[ProgramState]) -> None:
        self.parent = parent
        self.states = states

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        """What `forks[i] += ...` stores back: the branch itself (`+=` extends it in place)."""
        if state is not self.states[i]:
            raise ProgramError(f"forks[{i}] can only be extended (forks[{i}] += ...), not replaced")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        if isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ProgramError(
                    f"a list added to {len(self.states)} forks needs one item a fork, got {len(other)}"
                )
            items = other
        elif callable(other) and not isinstance(other, Expr):
            items = [other(i) for i in range(len(self.states))]
        else:
            items = [other] * len(self.states)
        for state, item in zip(self.states, items):
            state += item
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Bring the branches back: by default each variable they created becomes a list on the parent
        (one value a branch); "concate_and_append" appends their texts to the parent's instead."""
        if any(s._joined for s in self.states):
            raise ProgramError("these forks were already joined")
        self.parent._join(self, mode)
