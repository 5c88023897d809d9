"""`sgjit.clear_jit_cache()`: drop the compiled plans of a backend (the default one unless given)."""

from __future__ import annotations

from typing import Any

from sgjit.lang.default_backend import resolve_backend


def clear_jit_cache(backend: Any = None) -> int:
    """Drop every compiled plan of the backend (in-process, or on a server through its client),
    unpinning their prefixes; returns how many were dropped."""
    return resolve_backend(backend).clear_jit_cache()
