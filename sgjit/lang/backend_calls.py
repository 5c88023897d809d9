"""What a program's user can ask of a backend directly (the default one unless given), as SGLang's
`sgl.flush_cache()`, `sgl.get_server_info()` and sgjit's `clear_jit_cache()`."""

from __future__ import annotations

from typing import Any

from sgjit.lang.default_backend import resolve_backend


def clear_jit_cache(backend: Any = None) -> int:
    """Drop every compiled plan of the backend (in-process, or on a server through its client),
    unpinning their prefixes; returns how many were dropped."""
    return resolve_backend(backend).clear_jit_cache()


def flush_cache(backend: Any = None) -> int:
    """Drop every prefix-cache entry no running request uses; returns the pages freed (on a server:
    what it answered)."""
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The backend's model, settings and counters."""
    return resolve_backend(backend).get_server_info()
