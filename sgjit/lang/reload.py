"""`reload_function`: pick up a program function's edited source without restarting the process
(the interactive loop: edit the prompt, rerun). The function's definition is read again from its
file and executed in its module's namespace — decorators included, so the module's name now refers
to the new function — then re-traced; if the plan changed, the backends drop what they cached for
the old one."""

from __future__ import annotations

import ast
import linecache
from pathlib import Path
from typing import Any

from sgjit.errors import ProgramError, TraceError
from sgjit.lang.default_backend import get_default_backend, resolve_backend
from sgjit.lang.function import Function


def _plan_hash(function: Function) -> str | None:
    try:
        plan = function.plan()
    except TraceError:
        return None
    return plan.plan_hash if plan is not None else None


def _rebuild(old: Function) -> Function:
    func = old.func
    if func.__qualname__ != func.__name__:
        raise ProgramError(
            f"reload_function needs a module-level function; {func.__qualname__} is defined inside another "
            "function or class"
        )
    filename = func.__code__.co_filename
    try:
        source = Path(filename).read_text(encoding="utf-8")
    except OSError as e:
        raise ProgramError(f"cannot re-read {func.__name__}() from {filename}: {e}") from e
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise ProgramError(f"{filename} no longer parses: {e}") from e
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func.__name__]
    if not defs:
        raise ProgramError(f"{filename} no longer defines {func.__name__}() at module level")
    linecache.checkcache(filename)  # tracebacks and inspect.getsource() show the new text
    namespace = func.__globals__
    exec(compile(ast.Module(body=[defs[-1]], type_ignores=[]), filename, "exec"), namespace)
    new = namespace[func.__name__]
    if not isinstance(new, Function):  # the decorator was removed: keep it a program function
        new = namespace[func.__name__] = Function(new, jit=old.jit)
    return new


def reload_function(function: Function | str, backend: Any = None) -> Function:
    """The function rebuilt from its current source. `function` is a program function, or the name
    of one that has run on `backend` (default: the default backend)."""
    if isinstance(function, str):
        found = resolve_backend(backend).lookup_function(function)
        if found is None:
            raise ProgramError(
                f"no program function named {function!r} has run on this backend; pass the function"
            )
        function = found
    if not isinstance(function, Function):
        raise ProgramError(
            f"reload_function takes an @sgjit.function or its name, not a {type(function).__name__}"
        )
    old_hash = _plan_hash(function)
    new = _rebuild(function)
    backends = set(function.backends)
    extra = resolve_backend(backend) if backend is not None else get_default_backend()
    if extra is not None:
        backends.add(extra)
    if old_hash is not None and old_hash != _plan_hash(new):
        for b in backends:
            b.invalidate_plan(old_hash)
    for b in function.backends:
        b.register_function(new)
        new.backends.add(b)
    return new
