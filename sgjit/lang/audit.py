"""What a traced program may call. A trace runs the function once, so anything it reads from outside
(a clock, a file, a network service, another model call) would be frozen into the plan as if it were
constant. While tracing, every call made from the program's own code is checked: the sgjit language,
the program's own helpers (their calls are checked in turn), methods of plain values (str, list, dict,
...) and a few pure builtins pass; any other call is an external call and stops the trace."""

from __future__ import annotations

import builtins
import os
import sys
import sysconfig
from types import FrameType
from typing import Any

from sgjit.errors import TraceError

_SGJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# What a program may call in sgjit: the language itself, not the runtime behind it.
_DSL_FILES = frozenset(
    os.path.join(_SGJIT_DIR, *f.split("/"))
    for f in (
        "lang/primitives.py", "lang/state.py", "lang/expr.py", "lang/function.py", "lang/choices.py",
        "lang/trace.py",
    )
)  # fmt: skip
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for k, p in sysconfig.get_paths().items()
        if k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)

_PURE_BUILTINS = frozenset({
    "len", "isinstance", "issubclass", "min", "max", "sum", "sorted", "abs", "round", "any", "all", "iter", "next",
})  # fmt: skip
_VALUE_TYPES = (str, bytes, int, float, bool, list, tuple, dict, set, frozenset)
_PURE_LIBRARY = frozenset(
    {("json", "dumps"), ("json", "loads"), ("textwrap", "dedent"), ("textwrap", "indent")}
)


def is_program_code(frame: FrameType) -> bool:
    """Code the user wrote: not sgjit, not the standard library, not an installed package. The
    module decides too, for code without a file of its own (a dataclass's generated __init__)."""
    module = frame.f_globals.get("__name__") or ""
    if module == "sgjit" or module.startswith("sgjit."):
        return False
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen") or filename.startswith(_SGJIT_DIR):
        return False
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS) if os.path.isabs(filename) else True


def location(frame: FrameType | None) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"


def _allowed_python(frame: FrameType) -> bool:
    if frame.f_code.co_filename in _DSL_FILES or is_program_code(frame):
        return True
    return (frame.f_globals.get("__name__"), frame.f_code.co_name) in _PURE_LIBRARY


def _allowed_builtin(fn: Any) -> bool:
    owner = getattr(fn, "__self__", None)
    if owner is builtins or owner is None:
        return getattr(fn, "__name__", None) in _PURE_BUILTINS
    return isinstance(owner, _VALUE_TYPES) or (isinstance(owner, type) and issubclass(owner, _VALUE_TYPES))


def _describe(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{module}.{name}" if module else name


class CallAudit:
    """A profile hook for the tracing thread. The first violation is raised at the call and kept,
    so a program that swallows the exception still fails its trace."""

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name
        self.violation: TraceError | None = None
        self._previous: Any = None

    def __enter__(self) -> CallAudit:
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous)

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            caller = frame.f_back
            if caller is None or not is_program_code(caller) or _allowed_python(frame):
                return
            name = f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}"
        elif event == "c_call":
            caller = frame
            if not is_program_code(caller) or _allowed_builtin(arg):
                return
            name = _describe(arg)
        else:
            return
        self.violation = TraceError(
            f"{location(caller)}: cannot trace {self.function_name}(): it calls {name}(), outside the program; "
            "a plan would freeze that call's result. Move the call out of the program and pass its result "
            "as an argument, or run the program interpreted with @sgjit.function(jit=False)"
        )
        sys.setprofile(None)
        raise self.violation
