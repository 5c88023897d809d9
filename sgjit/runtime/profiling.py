"""torch.profiler windows over the engine's work, written as Chrome traces; NVTX ranges are switched on
while a window is open."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sgjit.nvtx import reset_nvtx, set_nvtx
from sgjit.settings import env

log = logging.getLogger(__name__)


class TraceWindow:
    """One torch.profiler window. Start and stop it on the thread whose work it should record (the
    engine thread: see `Runtime.start_profile`)."""

    def __init__(self, out_dir: Path, name: str) -> None:
        self.path = Path(out_dir) / f"{name}.trace.json"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        stacks = env().profile_with_stack
        self.prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=stacks)

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        set_nvtx(True)
        self.prof.start()

    def stop(self) -> Path:
        self.prof.stop()
        reset_nvtx()
        self.prof.export_chrome_trace(str(self.path))
        log.info("profile written to %s", self.path)
        return self.path
