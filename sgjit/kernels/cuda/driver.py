"""The CUDA driver library through ctypes, for the few calls neither torch nor CuPy offers:
`cuLaunchKernelEx` (launch attributes, pdl.py) and a strided copy between host and device in one
call (`memcpy_2d_async`); and torch's current stream without `torch.cuda.current_stream()`'s Python
path (`current_stream_handle`, `current_torch_stream`). Loaded on first use; importing this module
needs no GPU."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from sgjit.errors import KernelError

_UNIFIED = 4  # CUmemorytype: an address in the unified space, host (pinned) or device alike


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D."""

    _fields_ = [
        ("src_x_bytes", ctypes.c_size_t), ("src_y", ctypes.c_size_t), ("src_memory_type", ctypes.c_int),
        ("src_host", ctypes.c_void_p), ("src_device", ctypes.c_uint64), ("src_array", ctypes.c_void_p),
        ("src_pitch", ctypes.c_size_t),
        ("dst_x_bytes", ctypes.c_size_t), ("dst_y", ctypes.c_size_t), ("dst_memory_type", ctypes.c_int),
        ("dst_host", ctypes.c_void_p), ("dst_device", ctypes.c_uint64), ("dst_array", ctypes.c_void_p),
        ("dst_pitch", ctypes.c_size_t),
        ("width_bytes", ctypes.c_size_t), ("height", ctypes.c_size_t),
    ]  # fmt: skip


@functools.cache
def libcuda() -> Any:
    """The driver, its calls made holding the GIL (`PyDLL`): they only queue work and return within
    microseconds, and a thread that lets the GIL go may wait a switch interval to get it back."""
    try:
        return ctypes.PyDLL("libcuda.so.1")
    except OSError as e:
        raise KernelError(f"the CUDA driver library could not be loaded: {e}") from e


@functools.cache
def _memcpy_2d() -> tuple[Any, _Memcpy2D]:
    fn = libcuda().cuMemcpy2DAsync_v2
    fn.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    spec = _Memcpy2D()
    spec.src_memory_type = spec.dst_memory_type = _UNIFIED
    return fn, spec


def memcpy_2d_async(
    dst: int, dst_pitch: int, src: int, src_pitch: int, width_bytes: int, height: int, stream: int
) -> None:
    """Queue a copy of `height` rows of `width_bytes` from `src` to `dst` (unified addresses: pinned
    host or device memory, either way) on the raw stream handle `stream`. Called from the engine
    thread only: the one spec struct is reused."""
    fn, spec = _memcpy_2d()
    spec.src_device, spec.src_pitch, spec.dst_device, spec.dst_pitch = src, src_pitch, dst, dst_pitch
    spec.width_bytes, spec.height = width_bytes, height
    err = fn(ctypes.byref(spec), stream)
    if err != 0:
        raise KernelError(f"cuMemcpy2DAsync failed with CUresult {err}")


def current_stream_handle() -> int:
    """torch's current raw stream handle, from torch's C binding (as Triton and Inductor take it):
    `torch.cuda.current_stream()` resolves the device through eight Python calls, on every call."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


_torch_streams: dict[int, torch.cuda.Stream] = {}


def current_torch_stream() -> torch.cuda.Stream:
    """torch's current stream as its `torch.cuda.Stream` object (for `Event.record`), built once per
    raw handle."""
    handle = current_stream_handle()
    stream = _torch_streams.get(handle)
    if stream is None:
        stream = _torch_streams[handle] = torch.cuda.current_stream()
    return stream
