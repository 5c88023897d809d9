"""Programmatic dependent launch (Hopper and later): a kernel launched with this attribute may start
while the kernel before it on the stream is still running, once every block of that kernel has
called `griddepcontrol.launch_dependents` (common.cuh: `pdl_launch_dependents`). Until its own
`griddepcontrol.wait` (`pdl_wait`) returns it may only read what the kernels before it cannot be
writing: weights, and metadata the host copied before the step. That is what hides a decode
kernel's ramp (its first weight loads) behind the tail of the previous one.

CuPy's launch takes no launch attributes, so this calls the driver's `cuLaunchKernelEx` through
ctypes. A stream capture records the attribute as a programmatic edge of the CUDA graph."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from sgjit.errors import KernelError
from sgjit.kernels.cuda.driver import libcuda

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _AttrValue(ctypes.Union):
    _fields_ = [("programmatic_serialization_allowed", ctypes.c_int), ("pad", ctypes.c_char * 64)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint),
    ]  # fmt: skip


_CTYPES = {
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.float32): ctypes.c_float,
}


@functools.cache
def _driver() -> Any:
    try:
        fn = libcuda().cuLaunchKernelEx
    except AttributeError as e:
        raise KernelError(f"the CUDA driver has no cuLaunchKernelEx: {e}") from e
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def _attribute() -> _Attr:
    attr = _Attr()
    attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmatic_serialization_allowed = 1
    return attr


def launch_dependent(
    function: int, grid: tuple[int, ...], block: int, smem: int, stream: int, args: tuple
) -> None:
    """Launch the CUfunction `function` (numpy-scalar `args`, as the CuPy launch takes them) on the
    raw stream handle `stream`, allowed to overlap the kernel before it."""
    values = []
    for a in args:
        ctype = _CTYPES.get(getattr(a, "dtype", None))
        if ctype is None:
            raise TypeError(f"kernel argument {a!r}: pass a numpy scalar of a fixed-size type")
        values.append(ctype(a.item()))
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    config = _Config(gx, gy, gz, block, 1, 1, smem, stream, ctypes.pointer(_attribute()), 1)
    err = _driver()(ctypes.byref(config), function, params, None)
    if err != 0:
        raise KernelError(f"cuLaunchKernelEx failed with CUresult {err}")
