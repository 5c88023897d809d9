"""Compiling kernel families with NVRTC through CuPy and launching them on torch's stream.

Compiled modules are cached in memory here and on disk by CuPy's kernel cache, whose directory is
put under the sgjit cache dir (`SGJIT_CACHE_DIR/cupy`) so a new process loads cubins instead of
paying NVRTC again. CuPy picks `-arch=sm_XY` from the current device (a family that needs an
arch-specific target, such as sm_90a, adds it to its options). Launches go on
`torch.cuda.current_stream()` through a CuPy `ExternalStream`, with raw `data_ptr()`s and numpy
scalars as arguments — no CuPy arrays, no allocation, so every launch can be captured in a CUDA
graph."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sgjit.errors import KernelError
from sgjit.kernels.cuda.driver import current_stream_handle
from sgjit.kernels.cuda.pdl import launch_dependent
from sgjit.kernels.sources import family_source
from sgjit.nvtx import nvtx_range
from sgjit.settings import env

log = logging.getLogger(__name__)

COMPILE_OPTIONS = ("-std=c++17",)
_modules: dict[tuple[str, str, tuple[str, ...]], Any] = {}
_streams: dict[int, Any] = {}
_lock = threading.Lock()


def cupy_module() -> Any:
    """Import CuPy with its kernel cache under the sgjit cache dir. Raises KernelError when CuPy
    is not installed (the caller then keeps the reference ops)."""
    if "cupy" not in sys.modules:
        os.environ.setdefault("CUPY_CACHE_DIR", str(env().cache_dir / "cupy"))
    try:
        import cupy
    except ImportError as e:
        raise KernelError("CuPy is not installed (pip install 'sgjit[cuda13]'); using torch ops") from e
    return cupy


def compile_kernels(
    family: str, names: Sequence[str], defines: tuple[str, ...] = (), options: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The kernels `names` (C++ name expressions) of one family, compiled for the current device,
    one module per instantiation so ops that share one (and later processes, through CuPy's disk
    cache) reuse it; `defines` are NAME=VALUE macros, `options` further NVRTC flags. Raises
    KernelError naming the instantiation when NVRTC or the load fails."""
    cupy = cupy_module()
    flags = COMPILE_OPTIONS + options + tuple(f"-D{d}" for d in defines)
    kernels = {}
    with _lock:
        for name in names:
            key = (family, name, defines + options)
            try:
                module = _modules.get(key)
                if module is None:
                    module = cupy.RawModule(
                        code=family_source(family), options=flags, name_expressions=[name]
                    )
                kernels[name] = module.get_function(name)
            except Exception as e:  # CompileException, CUDADriverError, ...
                raise KernelError(f"compiling {family}.cu [{name}] failed: {e}") from e
            _modules[key] = module
    return kernels


def compiled_module(family: str, name: str, defines: tuple[str, ...] = ()) -> Any:
    """The CuPy module compile_kernels built for one instantiation (for its __device__ globals)."""
    return _modules[(family, name, defines)]


def allow_smem(kernel: Any, nbytes: int) -> None:
    """Raise a kernel's dynamic shared memory limit (needed above 48 KB)."""
    if nbytes > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = nbytes


_resident: dict[tuple[int, int, int], int] = {}


def resident_blocks(kernel: Any, threads: int, smem: int) -> int:
    """Blocks of `kernel` one SM holds at once with `smem` bytes of dynamic shared memory each (the
    driver's occupancy calculator; `allow_smem` first above 48 KB), at least 1. A CuPy `RawKernel`
    holds no handle itself: its `kernel` property is the `cupy.cuda.function.Function` loaded on the
    current device, whose `ptr` is the CUfunction the driver call takes."""
    func = kernel.kernel.ptr
    key = (func, threads, smem)
    if key not in _resident:
        occupancy = cupy_module().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
        _resident[key] = max(1, occupancy(func, threads, smem))
    return _resident[key]


def current_stream() -> Any:
    """torch's current stream as a CuPy stream (cached per stream handle)."""
    handle = current_stream_handle()
    s = _streams.get(handle)
    if s is None:
        s = _streams[handle] = cupy_module().cuda.ExternalStream(handle)
    return s


def ptr(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


_sm90_or_later: dict[int, bool] = {}


def pdl_enabled() -> bool:
    """Whether launches that ask for it overlap the kernel before them (pdl.py): on a device of
    compute capability 9.0+ with SGJIT_PDL on (the default), and only while a CUDA graph is being
    captured: the decode steps, whose kernels run back to back. Eager launches keep CuPy's launch
    (its Cython path is cheaper on the host than the ctypes call)."""
    if not torch.cuda.is_current_stream_capturing():
        return False
    device = torch._C._cuda_getDevice()
    hopper = _sm90_or_later.get(device)  # compute capability by device, asked once
    if hopper is None:
        hopper = _sm90_or_later[device] = torch.cuda.get_device_capability(device) >= (9, 0)
    return hopper and env().pdl


def launch(
    kernel: Any, grid: tuple[int, ...], block: int, args: tuple, smem: int = 0, pdl: bool = False
) -> None:
    """Launch on torch's current stream. `pdl`: the kernel calls `pdl_wait()` before it reads what
    the kernel before it writes (common.cuh), so it may be launched to overlap that kernel."""
    if min(grid) <= 0:
        return
    with nvtx_range(kernel.name if hasattr(kernel, "name") else "sgjit kernel"):
        if pdl and pdl_enabled():
            launch_dependent(kernel.kernel.ptr, grid, block, smem, current_stream_handle(), args)
        else:
            kernel(grid, (block,), args, shared_mem=smem, stream=current_stream())
