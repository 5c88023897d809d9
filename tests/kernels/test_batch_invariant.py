"""The deterministic mode's pieces that run anywhere: fixed-row GEMMs, the selector's batch-invariant
attention choice, and the clear refusal where the mode cannot hold (the GPU half is in
tests/runtime/test_deterministic_gpu.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sgjit
from sgjit.errors import InvalidRequestError
from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.batch_invariant import fixed_rows
from sgjit.kernels.selector import MAX_DECODE_SPLITS, KernelSelector
from sgjit.kernels.spec import ModelShapes, Workload
from sgjit.runtime.model.presets import shape_config
from sgjit.server.args import add_serve_arguments, server_args_from

H200 = DeviceProfile.from_dict(
    json.loads((Path(__file__).parents[1] / "data" / "device_profiles.json").read_text())["H200"]
)


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
def test_fixed_rows_linear_is_the_linear(rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3, 24, generator=g)
    w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    out = fixed_rows(F.linear, rows=16)(x, w, b)
    assert out.shape == (rows, 3, 40)
    torch.testing.assert_close(out, F.linear(x, w, b))


def test_a_rows_result_does_not_depend_on_its_batch():
    """Every row comes out bit for bit the same alone, in a small batch and in a large one, at any
    position (the GEMM always sees `rows` rows)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 512, generator=g)
    x = torch.randn(70, 512, generator=g)
    lin = fixed_rows(F.linear, rows=32)
    whole = lin(x, w, None)
    for i in (0, 31, 32, 69):
        assert torch.equal(lin(x[i : i + 1], w, None)[0], whole[i])
        assert torch.equal(lin(x[max(0, i - 3) : i + 1], w, None)[-1], whole[i])
    assert torch.equal(lin(x.flip(0), w, None).flip(0), whole)


def test_selector_gives_one_tile_and_fixed_splits():
    shapes = ModelShapes.from_config(shape_config("llama3-8b"), torch.bfloat16, torch.bfloat16, 16)
    sel = KernelSelector()
    normal = sel.select(H200, shapes, Workload(256, 131072, 2048))["attention"]
    inv = sel.select(H200, shapes, Workload(256, 131072, 2048, batch_invariant=True))["attention"]
    t = inv.tunables
    assert t["decode_tile"] == t["prefill_tile"] and "batch-invariant" in inv.reason
    assert normal.tunables.get("split_len", 0) == 0
    split = t["split_len"]
    assert split % t["decode_tile"].bn == 0 and split >= 512
    assert -(-131072 // split) <= MAX_DECODE_SPLITS
    short = sel.select(H200, shapes, Workload(8, 2048, 512, batch_invariant=True))["attention"]
    assert short.tunables["split_len"] == 512


def test_deterministic_needs_the_cuda_kernels():
    with pytest.raises(InvalidRequestError, match="deterministic inference needs sgjit's CUDA kernels"):
        sgjit.Runtime(device="cpu", deterministic=True, max_total_tokens=256)


def _parse(argv: list[str]):
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return server_args_from(p.parse_args(argv))


def test_serve_flag_sets_the_runtime_option():
    assert _parse(["--enable-deterministic-inference"]).runtime.deterministic is True
    assert _parse([]).runtime.deterministic is False
