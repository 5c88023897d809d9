"""A kernel that fails to compile, or fails at launch, leaves its op on the torch reference with one
warning naming the kernel, and the other ops on their kernels. Runs on the CPU with a stand-in for
CuPy; importing sgjit never imports CuPy."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sgjit.errors import KernelError
from sgjit.kernels import reference, table
from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.cuda import module
from sgjit.kernels.grouped_moe import moe_experts_grouped
from sgjit.kernels.guard import GuardedOp
from sgjit.kernels.registry import FUSED_OPS
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import ModelShapes
from sgjit.runtime.model.presets import shape_config

H200 = DeviceProfile.from_dict(
    json.loads((Path(__file__).parents[1] / "data" / "device_profiles.json").read_text())["H200"]
)


class _FakeFunction:
    """cupy.cuda.function.Function: a kernel loaded on one device, `ptr` its CUfunction handle."""

    def __init__(self) -> None:
        self.ptr = id(self)


class _FakeKernel:
    """Shaped as CuPy 14's RawKernel: no handle of its own, its loaded Function behind `kernel`."""

    max_dynamic_shared_size_bytes = 0

    def __init__(self) -> None:
        self._function = _FakeFunction()

    @property
    def kernel(self) -> _FakeFunction:
        return self._function


class _FakeDriver:
    """cupy.cuda.driver's occupancy call: takes the CUfunction as an integer (Cython's intptr_t)."""

    calls: list[tuple[int, int, int]] = []
    blocks = 3

    @staticmethod
    def occupancyMaxActiveBlocksPerMultiprocessor(func: int, threads: int, smem: int) -> int:  # noqa: N802
        if not isinstance(func, int):
            raise TypeError(f"an integer is required, got {type(func).__name__}")
        _FakeDriver.calls.append((func, threads, smem))
        return _FakeDriver.blocks


class _FakeCupy:
    """Compiles everything except the kernels named in `failing` (the attention family by default),
    which fail as NVRTC would."""

    failing = ("attention_kernel",)

    class cuda:  # noqa: N801
        driver = _FakeDriver

    class RawModule:
        def __init__(self, code: str, options: tuple, name_expressions: list[str]) -> None:
            if any(n.startswith(_FakeCupy.failing) for n in name_expressions):
                raise RuntimeError("nvrtc: error: forced failure")
            self.names = name_expressions

        def get_function(self, name: str) -> _FakeKernel:
            return _FakeKernel()


@pytest.fixture
def fake_cupy(monkeypatch):
    monkeypatch.setattr(module, "cupy_module", lambda: _FakeCupy)
    monkeypatch.setattr(table, "cupy_module", lambda: _FakeCupy)
    monkeypatch.setattr(module, "_modules", {})
    monkeypatch.setenv("SGJIT_KERNELS", "auto")


def _shapes():
    return ModelShapes.from_config(shape_config("llama3-8b"), torch.bfloat16, torch.bfloat16, 16)


def test_compile_failure_falls_back_for_that_op_only(fake_cupy, caplog):
    ks = KernelSelector().select(H200, _shapes())
    with caplog.at_level(logging.WARNING):
        ops = table.build_ops(H200, _shapes(), ks)
    assert ops.attention is reference.attention
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "attention" in warnings[0] and "attention_kernel<__nv_bfloat16" in warnings[0]
    for op in ("rmsnorm", "add_rmsnorm", "rope_store_kv", "silu_mul", "sample", "apply_bitmask"):
        assert isinstance(getattr(ops, op), GuardedOp), op
    x = torch.randn(3, 4096).bfloat16()  # CPU tensors: the kernel ops hand them to the reference
    w = torch.ones(4096).bfloat16()
    assert torch.equal(ops.rmsnorm(x, w, 1e-5), reference.rmsnorm(x, w, 1e-5))


def test_fused_ops_fall_back_to_the_unfused_kernels(fake_cupy, monkeypatch):
    """The fused decode ops are built as one unit with the selector's rows; a step they do not take
    (here: CPU tensors) runs as the table's unfused ops, which hand CPU tensors to the reference."""
    ks = KernelSelector().select(H200, _shapes())
    ops = table.build_ops(H200, _shapes(), ks)
    assert ops.fused_rows == ks["linear_residual"].tunables["rows"] >= 1
    for op in FUSED_OPS:
        assert isinstance(getattr(ops, op), GuardedOp), op
    x, w, r = torch.randn(2, 64).bfloat16(), torch.randn(32, 64).bfloat16(), torch.randn(2, 32).bfloat16()
    norm = torch.rand(64).bfloat16()
    assert torch.equal(ops.linear_residual(x, w, r), reference.linear_residual(x, w, r))
    assert torch.equal(
        ops.rmsnorm_gate_up_silu(x, norm, 1e-5, w), reference.rmsnorm_gate_up_silu(x, norm, 1e-5, w)
    )


def test_fused_kernels_failing_to_compile_leave_decode_unfused(fake_cupy, monkeypatch, caplog):
    monkeypatch.setattr(_FakeCupy, "failing", ("attention_kernel", "gemv_residual_kernel"))
    with caplog.at_level(logging.WARNING):
        ops = table.build_ops(H200, _shapes(), KernelSelector().select(H200, _shapes()))
    assert ops.fused_rows == 0 and isinstance(ops.linear, GuardedOp)
    assert all(getattr(ops, op) is getattr(reference, op) for op in FUSED_OPS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "gemv_residual_kernel" in warnings[1]  # attention's, then the fused ops'


def test_occupancy_query_takes_the_loaded_function_handle(fake_cupy, monkeypatch):
    """The fused GEMVs size their grid by the driver's occupancy of the compiled kernel, whose handle
    is the loaded Function's `ptr` (a CuPy RawKernel has none itself); one query per (kernel,
    threads, shared memory), and at least one block."""
    from sgjit.kernels.cuda.fused_gemv import NORM, fused_name

    monkeypatch.setattr(module, "_resident", {})
    monkeypatch.setattr(_FakeDriver, "calls", [])
    name = fused_name(NORM, "bfloat16", "bfloat16", 4, "bfloat16")
    kernel = module.compile_kernels("gemv", [name])[name]
    assert [module.resident_blocks(kernel, 128, 8192) for _ in range(2)] == [3, 3]
    assert _FakeDriver.calls == [(kernel.kernel.ptr, 128, 8192)]
    monkeypatch.setattr(_FakeDriver, "blocks", 0)
    assert module.resident_blocks(kernel, 128, 200 * 1024) == 1


def test_missing_cupy_keeps_reference_ops(monkeypatch, caplog):
    def no_cupy():
        raise KernelError("CuPy is not installed")

    monkeypatch.setattr(table, "cupy_module", no_cupy)
    monkeypatch.setenv("SGJIT_KERNELS", "auto")
    with caplog.at_level(logging.WARNING):
        ops = table.build_ops(H200, _shapes(), KernelSelector().select(H200, _shapes()))
    assert ops == reference.REFERENCE_OPS
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


def test_launch_failure_warns_once_and_stays_on_reference(caplog):
    calls = []

    def broken(x):
        calls.append(x)
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    op = GuardedOp("silu_mul", "activation.cu:silu_mul", broken, reference.silu_mul)
    x = torch.randn(2, 16)
    with caplog.at_level(logging.WARNING):
        first, second = op(x), op(x)
    assert torch.equal(first, reference.silu_mul(x)) and torch.equal(second, first)
    assert len(calls) == 1 and op.failed
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 1 and "activation.cu:silu_mul" in msgs[0]


def test_importing_sgjit_does_not_import_cupy():
    code = (
        "import sys, sgjit, sgjit.kernels.table, sgjit.kernels.nvcc_check; assert 'cupy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_cupy_keeps_the_grouped_moe_op(monkeypatch):
    """The grouped MoE op is torch's own: it serves without CuPy, guarded like a kernel."""

    def no_cupy():
        raise KernelError("CuPy is not installed")

    monkeypatch.setattr(table, "cupy_module", no_cupy)
    monkeypatch.setenv("SGJIT_KERNELS", "auto")
    moe = ModelShapes.from_config(shape_config("qwen3-30b-a3b"), torch.bfloat16, torch.bfloat16, 16)
    ops = table.build_ops(H200, moe, KernelSelector().select(H200, moe))
    assert isinstance(ops.moe_experts, GuardedOp) and ops.moe_experts.fn is moe_experts_grouped
    assert ops.moe_experts.kernel == "torch grouped_mm:moe_experts"
    assert ops.attention is reference.attention


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_quantize_takes_torch_for_what_the_kernel_does_not(fake_cupy, dtype):
    """Rows on the CPU or of another dtype get `fp8.quantize_rows`' own result (the kernel's
    definition), as do empty batches: odd widths, one row, a zero row."""
    from sgjit.kernels.cuda.fp8_quant import Fp8Quantize
    from sgjit.kernels.fp8 import quantize_rows

    q = Fp8Quantize(dtype, "bfloat16" if dtype == torch.bfloat16 else "float16")
    x = torch.randn(5, 37) * torch.logspace(-4, 2, 5)[:, None]
    x[2] = 0
    for rows in (x.to(dtype), x.to(dtype)[:1], x, torch.empty(0, 16, dtype=dtype)):
        data, scale = q.rows(rows)
        ref_data, ref_scale = quantize_rows(rows)
        assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
        assert torch.equal(scale, ref_scale) and scale.shape == (rows.shape[0], 1)


def test_guarded_op_shows_its_kernels_attributes_until_it_falls_back():
    """CUDA-graph bucketing asks the attention op for `decode_launch` through its guard; once the
    kernel failed, the reference op answers calls and the kernel's attributes are gone."""

    class Kernel:
        def decode_launch(self, rows, max_kv_len):
            return "split", 1

        def __call__(self, x):
            raise RuntimeError("launch failed")

    op = GuardedOp("attention", "attention_kernel", Kernel(), lambda x: x + 1)
    assert op.decode_launch(4, 512) == ("split", 1)
    assert op(1) == 2  # the kernel failed: the reference answered
    assert getattr(op, "decode_launch", None) is None
    with pytest.raises(AttributeError):
        getattr(op, "_private")  # noqa: B009 - what a private name gives
