"""Which threads are running a prompt program right now, so `gen()` and `select()` called anywhere
else fail at once with a message instead of building a step nobody runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sgjit.errors import ProgramError

_local = threading.local()


@contextmanager
def program_scope() -> Iterator[None]:
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def require_program(primitive: str) -> None:
    if not getattr(_local, "depth", 0):
        raise ProgramError(
            f"sgjit.{primitive}() was called outside a prompt program; call it inside a function "
            f"decorated with @sgjit.function, as in `s += sgjit.{primitive}(...)`"
        )
