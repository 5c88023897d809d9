"""Named ranges around scheduler steps, forward passes, kernel launches and plan nodes: NVTX ranges
(visible in Nsight Systems) on a GPU, and torch.profiler ranges on any device. They cost nothing
unless switched on (`SGJIT_NVTX=1`, or while a profiler window is open). Ground floor: every layer may
mark its work, so this module imports nothing of sgjit."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

_nvtx_on = os.environ.get("SGJIT_NVTX", "0") == "1"


def set_nvtx(enabled: bool) -> None:
    global _nvtx_on
    _nvtx_on = enabled


def reset_nvtx() -> None:
    """Back to what the environment asks for."""
    set_nvtx(os.environ.get("SGJIT_NVTX", "0") == "1")


_OFF = contextlib.nullcontext()


def nvtx_range(name: str | Callable[[], str]) -> contextlib.AbstractContextManager[None]:
    """An NVTX range on a GPU, and the same range in a torch.profiler trace (a `user_annotation` on
    the host, and on a GPU a `gpu_user_annotation` over the kernels it launched), so
    `sgjit.bench.trace_summary` can split a trace by engine step. `name` may be a function, called only
    while ranges are on (for names that cost a loop or a format). Off, one shared no-op context: the
    engine opens a range at every launch."""
    return _range(name) if _nvtx_on else _OFF


@contextlib.contextmanager
def _range(name: str | Callable[[], str]) -> Iterator[None]:
    if callable(name):
        name = name()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if cuda:
            torch.cuda.nvtx.range_pop()
