"""Host <-> device copies that never wait for the device. With overlap scheduling the host builds and
launches step N+1 while step N still runs; one blocking copy on that path (torch's default for
`torch.tensor(..., device="cuda")`, list indexing of a CUDA tensor, or `.tolist()` of one) waits for
step N and undoes the overlap. Inputs therefore go over with `non_blocking=True` (CUDA stages a
pageable source at once, without a device sync), and results come back into pinned host memory
behind an event that the host waits on only when it needs them."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A host list as a tensor on `device`, copied without waiting for work already queued there."""
    t = torch.tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


class Readback:
    """Device tensors on their way to the host: the copies are queued now, behind the work that
    produces them (so later launches may overwrite the sources), and `wait()` returns the host
    copies once they have arrived."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.event: torch.cuda.Event | None = None
        if tensors and tensors[0].device.type == "cuda":
            self.host = []
            for t in tensors:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                h.copy_(t, non_blocking=True)
                self.host.append(h)
            self.event = torch.cuda.Event()
            self.event.record()
        else:  # a copy: the next launch overwrites the futures' cells these may be views of
            self.host = [t.clone() for t in tensors]
        self.wait_seconds = 0.0  # how long `wait` blocked: device time, not host work

    def wait(self) -> list[torch.Tensor]:
        if self.event is not None:
            t = time.perf_counter()
            self.event.synchronize()  # releases the GIL: the output thread runs meanwhile
            self.wait_seconds = time.perf_counter() - t
            self.event = None
        return self.host
