"""Tracing: run a program function once, its arguments replaced by placeholders and its state by a
recorder, and keep the nodes it appends as a `GraphPlan`.

A placeholder can only be concatenated into the program (`"Q: " + question`). Anything that needs an
argument's contents (`if`, `len`, `.strip()`, an f-string), any read of a generated value (`s["x"]`,
`s.text()`), and any call outside the program (see `audit`) raise `TraceError` naming the file and
line; such a program runs interpreted instead."""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, NoReturn

import xxhash

from sgjit.compiler.nodes import Arg, ConstText, Fork, Join, Node
from sgjit.compiler.plan import GraphPlan
from sgjit.compiler.plan_check import ProgramChecker
from sgjit.errors import ProgramError, TraceError
from sgjit.lang.audit import CallAudit, is_program_code, location
from sgjit.lang.expr import Expr
from sgjit.lang.scope import program_scope
from sgjit.lang.state import ProgramState

_tracing = threading.local()  # .name: the function being traced in this thread

_HINT = "; run it interpreted with @sgjit.function(jit=False), or keep the program static"


def _program_frame() -> FrameType | None:
    frame = sys._getframe(1)
    while frame is not None and not is_program_code(frame):
        frame = frame.f_back
    return frame


def _fail(reason: str) -> NoReturn:
    name = getattr(_tracing, "name", "the program")
    raise TraceError(f"{location(_program_frame())}: cannot trace {name}(): {reason}{_HINT}")


class ArgPlaceholder(Expr):
    """A program argument during a trace: it concatenates into the program and nothing else."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        super().__init__((Arg(name),))
        self.name = name

    def as_param(self, what: str) -> NoReturn:
        _fail(f"argument {self.name!r} is used as {what}; a plan takes arguments only as text")

    def __str__(self) -> str:
        _fail(f"converts argument {self.name!r} to str; concatenate it with + instead")

    def __format__(self, spec: str) -> str:
        _fail(f'formats argument {self.name!r} in an f-string or format(); write "..." + {self.name} instead')

    def __bool__(self) -> bool:
        _fail(f"branches on argument {self.name!r}")

    def __eq__(self, other: object) -> bool:
        _fail(f"compares argument {self.name!r}")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = Expr.__hash__

    def __len__(self) -> int:
        _fail(f"takes the length of argument {self.name!r}")

    def __iter__(self) -> Any:
        _fail(f"iterates over argument {self.name!r}")

    def __contains__(self, item: object) -> bool:
        _fail(f"looks inside argument {self.name!r}")

    def __getitem__(self, key: object) -> Any:
        _fail(f"indexes argument {self.name!r}")

    def __index__(self) -> int:
        _fail(f"uses argument {self.name!r} as a number")

    __int__ = __float__ = __index__

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        _fail(f"calls .{attr} on argument {self.name!r}")


@dataclass(eq=False, slots=True)
class _PendingFork:
    children: list[Recorder]


@dataclass(eq=False, slots=True)
class _PendingJoin:
    fork: _PendingFork
    mode: str


class Recorder:
    """The sink of a traced state: appends become plan nodes; reads of the running program fail."""

    def __init__(self) -> None:
        self._items: list[Node | _PendingFork | _PendingJoin] = []
        self._forks: dict[int, _PendingFork] = {}  # id of a fork's first child -> the fork

    def append(self, node: Node) -> None:
        self._items.append(node)

    def fork(self, n: int) -> list[Recorder]:
        pending = _PendingFork([Recorder() for _ in range(n)])
        self._items.append(pending)
        self._forks[id(pending.children[0])] = pending
        return pending.children

    def join(self, children: list[Recorder], mode: str) -> None:
        self._items.append(_PendingJoin(self._forks[id(children[0])], mode))

    def sync(self) -> None:
        pass  # nothing runs during a trace, so there is nothing to wait for

    def read_var(self, name: str) -> Any:
        _fail(
            f"reads the generated variable {name!r} while it runs; a plan cannot branch on or reuse generated text"
        )

    def read_meta(self, name: str) -> Any:
        _fail(f"reads the meta info of {name!r} while it runs")

    def read_text(self) -> str:
        _fail("reads s.text() while it runs")

    def read_messages(self) -> list[dict[str, str]]:
        _fail("reads s.messages() while it runs")

    def read_variables(self) -> dict[str, Any]:
        _fail("reads s.variables() while it runs")

    def write_var(self, name: str, value: Any) -> None:
        _fail(f"sets the variable {name!r} while it runs; a plan's variables come from its gens")

    def freeze(self) -> tuple[Node, ...]:
        """The recorded nodes, adjacent constants merged (so `s += "a"; s += "b"` plans as "ab")."""
        out: list[Node] = []
        fork_index: dict[int, int] = {}
        for item in self._items:
            if isinstance(item, ConstText) and out and isinstance(out[-1], ConstText):
                out[-1] = ConstText(out[-1].text + item.text)
            elif isinstance(item, _PendingFork):
                fork_index[id(item)] = len(out)
                out.append(Fork(tuple(child.freeze() for child in item.children)))
            elif isinstance(item, _PendingJoin):
                out.append(Join(fork_index[id(item.fork)], item.mode))
            else:
                out.append(item)
        return tuple(out)


def source_hash(func: Callable[..., Any]) -> str:
    try:
        return xxhash.xxh64_hexdigest(inspect.getsource(func).encode("utf-8"))
    except (OSError, TypeError):
        return ""  # defined where there is no source file (a REPL, exec)


def _def_line(func: Callable[..., Any]) -> str:
    """file:line of the `def` itself (the code object starts at the first decorator)."""
    code = func.__code__
    line = code.co_firstlineno
    while (text := linecache.getline(code.co_filename, line)) and not text.lstrip().startswith(
        ("def ", "async def ")
    ):
        line += 1
    return f"{code.co_filename}:{line if text else code.co_firstlineno}"


def _raised_at(tb: TracebackType | None) -> str:
    where = "<unknown>"
    while tb is not None:
        if is_program_code(tb.tb_frame):
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def trace_program(func: Callable[..., Any], name: str, example_kwargs: dict[str, Any]) -> GraphPlan:
    """The plan of `func(s, **arguments)`. `example_kwargs` are checked against the signature and
    must be text (a plan inserts arguments as text); their values never enter the plan."""
    defined_at = _def_line(func)
    params = list(inspect.signature(func).parameters.values())[1:]
    variadic = [p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if variadic:
        raise TraceError(
            f"{defined_at}: cannot trace {name}(): *{variadic[0]} has no fixed argument names{_HINT}"
        )
    arg_names = tuple(p.name for p in params)
    unknown = sorted(set(example_kwargs) - set(arg_names))
    if unknown:
        raise ProgramError(f"{name}() has no parameter(s) {unknown}; its parameters are {list(arg_names)}")
    not_text = sorted(k for k, v in example_kwargs.items() if not isinstance(v, str))
    if not_text:
        raise ProgramError(f"trace({not_text[0]}=...) must be a str: a plan inserts arguments as text")
    recorder = Recorder()
    state = ProgramState(recorder, ProgramChecker())
    audit = CallAudit(name)
    outer, _tracing.name = getattr(_tracing, "name", None), name
    try:
        with program_scope(), audit:
            returned = func(state, **{n: ArgPlaceholder(n) for n in arg_names})
    except (TraceError, ProgramError) as e:
        if audit.violation is not None and audit.violation is not e:
            raise audit.violation from e
        raise
    except Exception as e:
        if audit.violation is not None:
            raise audit.violation from e
        raise TraceError(
            f"{_raised_at(e.__traceback__)}: cannot trace {name}(): {type(e).__name__}: {e}{_HINT}"
        ) from e
    finally:
        _tracing.name = outer
    if audit.violation is not None:
        raise audit.violation
    if returned is not None:
        raise TraceError(
            f"{defined_at}: cannot trace {name}(): it returns a value; a plan's result is its state{_HINT}"
        )
    return GraphPlan(name, arg_names, recorder.freeze(), source_hash(func))
