"""Profiling: NVTX ranges (visible in Nsight Systems) around scheduler steps, forward passes and plan
nodes, and torch.profiler windows written as Chrome traces. NVTX costs nothing unless switched on
(`SGJIT_NVTX=1`, or while a profiler window is open)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_nvtx_on = os.environ.get("SGJIT_NVTX", "0") == "1"


def set_nvtx(enabled: bool) -> None:
    global _nvtx_on
    _nvtx_on = enabled and torch.cuda.is_available()


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


class TraceWindow:
    """One torch.profiler window. Start and stop it on the thread whose work it should record (the
    engine thread: see `Runtime.start_profile`)."""

    def __init__(self, out_dir: Path, name: str) -> None:
        self.path = Path(out_dir) / f"{name}.trace.json"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, record_shapes=True, with_stack=False)

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        set_nvtx(True)
        self.prof.start()

    def stop(self) -> Path:
        self.prof.stop()
        set_nvtx(os.environ.get("SGJIT_NVTX", "0") == "1")
        self.prof.export_chrome_trace(str(self.path))
        log.info("profile written to %s", self.path)
        return self.path
