"""NVTX ranges (visible in Nsight Systems) around scheduler steps, forward passes, kernel launches and
plan nodes. They cost nothing unless switched on (`SGJIT_NVTX=1`, or while a profiler window is
open). Ground floor: every layer may mark its work, so this module imports nothing of sgjit."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

_nvtx_on = os.environ.get("SGJIT_NVTX", "0") == "1"


def set_nvtx(enabled: bool) -> None:
    global _nvtx_on
    _nvtx_on = enabled and torch.cuda.is_available()


def reset_nvtx() -> None:
    """Back to what the environment asks for."""
    set_nvtx(os.environ.get("SGJIT_NVTX", "0") == "1")


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    if not _nvtx_on:
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
