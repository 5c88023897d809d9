"""Which backend a run uses: the one passed in, else the process default set with
`set_default_backend`. A `Runtime` is accepted wherever a backend is and wrapped once."""

from __future__ import annotations

from typing import Any

from sgjit.errors import ProgramError
from sgjit.lang.backend import Backend
from sgjit.lang.runtime_backend import RuntimeBackend
from sgjit.runtime.runtime import Runtime

_default: Backend | None = None
_default_owner: Any = None  # what was passed in (a Runtime), kept alive while it is the default


def as_backend(obj: Any) -> Backend:
    if isinstance(obj, Runtime):
        return RuntimeBackend.of(obj)
    if isinstance(obj, Backend):
        return obj
    raise ProgramError(
        f"a {type(obj).__name__} is not an sgjit backend; pass an sgjit.Runtime "
        "(or an object implementing sgjit.lang.backend.Backend)"
    )


def set_default_backend(backend: Any) -> None:
    """Make `backend` (an `sgjit.Runtime`, or another Backend) the one runs use when given none."""
    global _default, _default_owner
    _default, _default_owner = as_backend(backend), backend


def get_default_backend() -> Backend | None:
    return _default


def default_backend_as_given() -> Any:
    """The default backend as it was passed to `set_default_backend` (a `Runtime` stays one)."""
    return _default_owner


def resolve_backend(backend: Any = None) -> Backend:
    if backend is not None:
        return as_backend(backend)
    if _default is None:
        raise ProgramError(
            "no backend to run on: call sgjit.set_default_backend(sgjit.Runtime()) first, or pass backend=..."
        )
    return _default
