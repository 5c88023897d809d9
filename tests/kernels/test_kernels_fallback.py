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
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import ModelShapes
from sgjit.runtime.model.presets import shape_config

H200 = DeviceProfile.from_dict(
    json.loads((Path(__file__).parents[1] / "data" / "device_profiles.json").read_text())["H200"]
)


class _FakeKernel:
    max_dynamic_shared_size_bytes = 0


class _FakeCupy:
    """Compiles everything except the attention family, which fails as NVRTC would."""

    class RawModule:
        def __init__(self, code: str, options: tuple, name_expressions: list[str]) -> None:
            if any(n.startswith("attention_kernel") for n in name_expressions):
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
