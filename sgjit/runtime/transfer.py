"""Host <-> device copies that never wait for the device. With overlap scheduling the host builds and
launches step N+1 while step N still runs; one blocking copy on that path (torch's default for
`torch.tensor(..., device="cuda")`, list indexing of a CUDA tensor, or `.tolist()` of one) waits for
step N and undoes the overlap. Inputs therefore go over with `non_blocking=True` (CUDA stages a
pageable source at once, without a device sync), and results come back into pinned host memory
behind an event that the host waits on only when it needs them.

The decode path's copies are the engine thread's host time per step, so they cost one driver call
each: `copy_async` moves a strided [rows, cols] block in one `cuMemcpy2DAsync` (torch would stage a
strided copy through a temporary and a kernel), `CornerCopy` does the same for the corner of a buffer
pair it read the pointers of once (the decode graphs' input loads), and read-backs land in pinned
buffers that are reused (`PinnedBuffers`; a pinned allocation costs tens of microseconds)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from sgjit.kernels.cuda.driver import current_stream_handle, current_torch_stream, memcpy_2d_async

_ALIGN = 64  # bytes: where each tensor of a read-back starts in its buffer


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A host list as a tensor on `device`, copied without waiting for work already queued there."""
    t = torch.tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def _rows(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(rows, bytes a row, pitch in bytes) of a tensor laid out as rows of contiguous elements
    (a contiguous one is one row); None for any other layout."""
    if t.dim() == 2 and t.shape[0] > 1 and t.stride(1) == 1:
        return t.shape[0], t.shape[1] * t.element_size(), t.stride(0) * t.element_size()
    if t.is_contiguous():
        nbytes = t.numel() * t.element_size()
        return 1, nbytes, nbytes
    return None


def copy_async(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`src` into `dst` (same shape and dtype), queued on the current stream where either is on a GPU
    (the host side pinned, or the copy is not asynchronous); each contiguous or [rows, cols] with
    contiguous rows. On the CPU, a plain copy."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"copy_async of {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)} {dst.dtype}")
    if dst.device.type == "cpu" and src.device.type == "cpu":
        dst.copy_(src)
        return
    d, s = _rows(dst), _rows(src)
    if d is None or s is None:
        raise ValueError(
            f"copy_async takes rows of contiguous elements, got strides {dst.stride()} <- {src.stride()}"
        )
    if dst.numel():
        memcpy_2d_async(dst.data_ptr(), d[2], src.data_ptr(), s[2], d[1], d[0], current_stream_handle())


class CornerCopy:
    """Copies of the top-left [rows, cols] corner of one 2-D tensor into another's (same dtype, each
    row contiguous), queued as `copy_async` queues them. Both tensors' pointers and pitches are read
    once: slicing the corner out of two tensors for each copy costs more host time than the copy's
    driver call (the decode graphs' loads send three corners a launch)."""

    def __init__(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if (
            dst.dim() != 2
            or src.dim() != 2
            or dst.dtype != src.dtype
            or dst.stride(1) != 1
            or src.stride(1) != 1
        ):
            raise ValueError(
                f"CornerCopy takes 2-D tensors of one dtype with contiguous rows, got {tuple(dst.shape)} "
                f"{dst.dtype} strides {dst.stride()} <- {tuple(src.shape)} {src.dtype} strides {src.stride()}"
            )
        self.dst, self.src = dst, src
        self.rows, self.cols = min(dst.shape[0], src.shape[0]), min(dst.shape[1], src.shape[1])
        self._itemsize = dst.element_size()
        self._on_gpu = dst.device.type != "cpu" or src.device.type != "cpu"
        self._pointers = (
            dst.data_ptr(), dst.stride(0) * self._itemsize, src.data_ptr(), src.stride(0) * self._itemsize
        )  # fmt: skip

    def __call__(self, rows: int, cols: int) -> None:
        if not (0 <= rows <= self.rows and 0 <= cols <= self.cols):
            raise ValueError(f"a [{rows}, {cols}] corner of [{self.rows}, {self.cols}]")
        if not self._on_gpu:
            self.dst[:rows, :cols].copy_(self.src[:rows, :cols])
        elif rows and cols:
            dst, dst_pitch, src, src_pitch = self._pointers
            memcpy_2d_async(
                dst, dst_pitch, src, src_pitch, cols * self._itemsize, rows, current_stream_handle()
            )


class PinnedBuffers:
    """Pinned host buffers (with an event each) lent to read-backs and given back once read, so a
    launch's read-back allocates nothing. The engine thread owns one."""

    def __init__(self) -> None:
        self._free: list[tuple[torch.Tensor, torch.cuda.Event]] = []

    def take(self, nbytes: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        for i, (buf, _) in enumerate(self._free):
            if buf.numel() >= nbytes:
                return self._free.pop(i)
        return torch.empty(max(nbytes, 4096), dtype=torch.uint8, pin_memory=True), torch.cuda.Event()

    def give(self, lent: tuple[torch.Tensor, torch.cuda.Event]) -> None:
        self._free.append(lent)


class Readback:
    """Device tensors on their way to the host: the copies are queued now, behind the work that
    produces them (so later launches may overwrite the sources), and `wait()` returns the host
    copies once they have arrived, in a pinned buffer lent by `buffers` that `release()` gives back
    once they have been read."""

    def __init__(self, tensors: list[torch.Tensor], buffers: PinnedBuffers) -> None:
        self.event: torch.cuda.Event | None = None
        self._lent: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self._buffers = buffers
        if tensors and tensors[0].device.type == "cuda":
            tensors = [t if _rows(t) is not None else t.contiguous() for t in tensors]
            sizes = [-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in tensors]
            self._lent = buffers.take(sum(sizes))
            buf, self.event = self._lent
            self.host, offset = [], 0
            for t, size in zip(tensors, sizes):
                h = buf[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                copy_async(h, t)
                self.host.append(h)
                offset += size
            self.event.record(current_torch_stream())
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

    def release(self) -> None:
        """The host copies have been read: their buffer goes back (after `wait`; once)."""
        if self._lent is not None and self.event is None:
            self._buffers.give(self._lent)
            self._lent = None
            self.host = []
