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
from types import CodeType, FrameType
from typing import Any

from sgjit.errors import TraceError

_SGJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DSL_DIRS = tuple(os.path.join(_SGJIT_DIR, d) + os.sep for d in ("lang", "compiler"))
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for k, p in sysconfig.get_paths().items()
        if k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)

_PURE_BUILTINS = frozenset(
    {
        "len",
        "isinstance",
        "issubclass",
        "min",
        "max",
        "sum",
        "sorted",
        "abs",
        "round",
        "any",
        "all",
        "iter",
        "next",
        "divmod",
    }
)
_VALUE_TYPES = (str, bytes, int, float, bool, list, tuple, dict, set, frozenset)
_PURE_LIBRARY = frozenset(
    {("json", "dumps"), ("json", "loads"), ("textwrap", "dedent"), ("textwrap", "indent")}
)


def is_program_code(filename: str) -> bool:
    """Code the user wrote: not sgjit, not the standard library, not an installed package."""
    if filename.startswith("<frozen") or filename.startswith(_SGJIT_DIR):
        return False
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS) if os.path.isabs(filename) else True


def location(frame: FrameType | None) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"


def _allowed_python(code: CodeType, frame: FrameType) -> bool:
    filename = code.co_filename
    if filename.startswith(_DSL_DIRS) or is_program_code(filename):
        return True
    return (frame.f_globals.get("__name__"), code.co_name) in _PURE_LIBRARY


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
            if caller is None or not is_program_code(caller.f_code.co_filename):
                return
            if _allowed_python(frame.f_code, frame):
                return
            name = f"{frame.f_globals.get('__name__')}.{frame.f_code.co_name}"
        elif event == "c_call":
            caller = frame
            if not is_program_code(caller.f_code.co_filename) or _allowed_builtin(arg):
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
