"""The dependent launch's host side (kernels/cuda/pdl.py) without a GPU: what reaches the driver's
cuLaunchKernelEx. The driver is replaced by a recorder of its arguments, so this checks the packing
(the launch config, the programmatic-serialization attribute, one pointer a kernel argument at a
value of the argument's C type); tests/runtime/test_pdl_gpu.py runs the real launches."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from sgjit.kernels.cuda import pdl


def test_config_attribute_and_arguments_reach_the_driver(monkeypatch):
    seen = {}

    def driver(config_ref, function, params, extra):
        config = ctypes.cast(config_ref, ctypes.POINTER(pdl._Config)).contents
        seen["grid"] = (config.grid_x, config.grid_y, config.grid_z)
        seen["block"] = (config.block_x, config.block_y, config.block_z)
        seen["smem"], seen["stream"], seen["function"] = config.smem, config.stream, function
        seen["attrs"] = [(config.attrs[i].id, config.attrs[i].value.programmatic_serialization_allowed) for i in range(config.num_attrs)]  # fmt: skip
        kinds = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_int64)
        seen["args"] = [ctypes.cast(params[i], ctypes.POINTER(k)).contents.value for i, k in enumerate(kinds)]
        assert extra is None
        return 0

    monkeypatch.setattr(pdl, "_driver", lambda: driver)
    args = (np.uint64(0xDEADBEEF000), np.int32(-5), np.float32(1.5), np.int64(1 << 40))
    pdl.launch_dependent(0x1234, (3, 2), 128, 4096, 0xABC, args)
    assert seen["grid"] == (3, 2, 1) and seen["block"] == (128, 1, 1)
    assert seen["smem"] == 4096 and seen["stream"] == 0xABC and seen["function"] == 0x1234
    assert seen["attrs"] == [(6, 1)]  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, allowed
    assert seen["args"] == [0xDEADBEEF000, -5, 1.5, 1 << 40]


def test_plain_python_numbers_are_refused_and_driver_errors_raise(monkeypatch):
    from sgjit.errors import KernelError

    monkeypatch.setattr(pdl, "_driver", lambda: lambda *a: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(TypeError, match="numpy scalar"):
        pdl.launch_dependent(1, (1,), 32, 0, 0, (5,))
    with pytest.raises(KernelError, match="CUresult 1"):
        pdl.launch_dependent(1, (1,), 32, 0, 0, (np.int32(5),))
