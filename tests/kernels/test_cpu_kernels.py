"""sgjit's C++ CPU kernels (sgjit/kernels/cpp/) against the torch reference ops: the GEMM on every
GGUF format within int16 activation rounding of the dequantized product; norms, SiLU·mul, RoPE +
KV store and paged attention within float rounding of the reference; each row's result the same
alone as in any batch (batch invariance); the portable C++ build equal bit for bit to this CPU's
SIMD build; and a clean fallback when the kernels cannot be built."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sgjit.kernels import reference
from sgjit.kernels.cpp import build
from sgjit.kernels.cpp.ops import CppOps
from sgjit.kernels.cpp.panels import to_panels
from sgjit.kernels.ops import AttentionMetadata, LayerKV
from sgjit.kernels.quant import BLOCKS

from gguf_blocks import random_blocks

NATIVE = build.native()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the C++ CPU kernels did not build here")


@pytest.fixture(scope="module")
def ops() -> CppOps:
    return CppOps(NATIVE)


@pytest.fixture(scope="module")
def portable() -> CppOps:
    """The portable C++ build (no SIMD intrinsics): the SIMD builds must compute exactly what it does."""
    lib = build.native("portable")
    if lib is None:
        pytest.skip("the portable build failed")
    return CppOps(lib)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_gemm_matches_the_dequantized_product(ops, qtype, rows):
    w = random_blocks(qtype, 200, 768, seed=1)  # 200 outputs: a partial last panel
    bias = torch.randn(200)
    x = torch.randn(rows, 768)
    y = ops.linear(x, to_panels(w), bias)
    ref = x.double() @ w.dequantize().double().T + bias.double()
    assert y.shape == (rows, 200) and y.dtype == torch.float32
    assert rel_err(y, ref) < 1e-4  # int16 activations: ~2e-5 seen


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_gemm_rows_do_not_depend_on_the_batch(ops, qtype):
    pw = to_panels(random_blocks(qtype, 96, 512, seed=2))
    x = torch.randn(67, 512) * torch.logspace(-3, 3, 67)[:, None]  # rows of very different sizes
    batched = ops.linear(x, pw)
    for i in (0, 3, 4, 66):
        assert torch.equal(ops.linear(x[i : i + 1], pw), batched[i : i + 1])
    assert torch.equal(ops.linear(x[5:14], pw), batched[5:14])


def test_gemm_in_bfloat16(ops):
    w = random_blocks("Q4_K", 64, 512, seed=3)
    x = torch.randn(7, 512).bfloat16()
    y = ops.linear(x, to_panels(w))
    assert y.dtype == torch.bfloat16
    ref = x.double() @ w.dequantize().double().T
    assert rel_err(y, ref) < 1e-2  # the output rounded to bf16
    assert torch.equal(ops.linear(x[2:3], to_panels(w)), y[2:3])


def test_elementwise_ops_match_the_reference(ops):
    torch.manual_seed(0)
    x, res, w = torch.randn(9, 576), torch.randn(9, 576), torch.randn(576)
    torch.testing.assert_close(ops.rmsnorm(x, w, 1e-5), reference.rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    normed, summed = ops.add_rmsnorm(x, res, w, 1e-5)
    ref_normed, ref_summed = reference.add_rmsnorm(x, res, w, 1e-5)
    assert torch.equal(summed, ref_summed)
    torch.testing.assert_close(normed, ref_normed, rtol=1e-5, atol=1e-5)
    gu = torch.randn(9, 2 * 1536) * 4
    torch.testing.assert_close(ops.silu_mul(gu), reference.silu_mul(gu), rtol=1e-5, atol=1e-6)
    xb, wb = x.bfloat16(), w.bfloat16()
    torch.testing.assert_close(
        ops.rmsnorm(xb, wb, 1e-5), reference.rmsnorm(xb, wb, 1e-5), rtol=1e-2, atol=1e-2
    )


def paged_pool(pages: int, page_size: int, hkv: int, d: int, dtype=torch.float32) -> LayerKV:
    """A pool whose unwritten slots hold NaN, as an uninitialised CPU pool may."""
    return LayerKV(
        torch.full((pages, page_size, hkv, d), float("nan"), dtype=dtype),
        torch.full((pages, page_size, hkv, d), float("nan"), dtype=dtype),
    )


def test_rope_store_kv_matches_the_reference(ops):
    torch.manual_seed(1)
    n, hq, hkv, d = 6, 9, 3, 64
    qkv = torch.randn(n, (hq + 2 * hkv) * d)  # q, k, v as views of one fused output, as the model has them
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)
    cos_sin = torch.randn(n, d)
    slots = torch.tensor([17, 3, 40, 41, 8, 0])
    ours, ref = paged_pool(8, 8, hkv, d), paged_pool(8, 8, hkv, d)
    assert torch.equal(
        ops.rope_store_kv(q, k, v, cos_sin, ours, slots),
        reference.rope_store_kv(q, k, v, cos_sin, ref, slots),
    )
    for a, b in ((ours.k, ref.k), (ours.v, ref.v)):
        flat_a, flat_b = a.view(-1, hkv, d), b.view(-1, hkv, d)
        assert torch.equal(flat_a[slots], flat_b[slots])


def ragged_batch(lens: list[tuple[int, int]], hq=9, hkv=3, d=64, page_size=4, seed=0):
    """Rows of (new tokens, context) with their keys in shuffled pages of a NaN-filled pool."""
    g = torch.Generator().manual_seed(seed)
    pages_per_row = [-(-ctx // page_size) for _, ctx in lens]
    perm = torch.randperm(sum(pages_per_row) + 1, generator=g) + 1  # page ids >= 1, shuffled
    kv = paged_pool(int(perm.max()) + 1, page_size, hkv, d)
    table = torch.zeros(len(lens), max(pages_per_row), dtype=torch.int32)
    at = 0
    for b, ((_, ctx), np_) in enumerate(zip(lens, pages_per_row)):
        table[b, :np_] = perm[at : at + np_].int()
        at += np_
        for t in range(ctx):
            slot = int(table[b, t // page_size]) * page_size + t % page_size
            kv.k.view(-1, hkv, d)[slot] = torch.randn(hkv, d, generator=g)
            kv.v.view(-1, hkv, d)[slot] = torch.randn(hkv, d, generator=g)
    qo = [0]
    for q_len, _ in lens:
        qo.append(qo[-1] + q_len)
    meta = AttentionMetadata(
        qo_indptr=torch.tensor(qo, dtype=torch.int32), kv_lens=torch.tensor([c for _, c in lens], dtype=torch.int32),
        page_table=table, page_size=page_size, max_q_len=max(q for q, _ in lens),
        max_kv_len=max(c for _, c in lens), qo_indptr_host=qo, kv_lens_host=[c for _, c in lens],
    )  # fmt: skip
    q = torch.randn(qo[-1], hq, d, generator=g)
    return q, kv, meta


def sub_batch(q, kv, meta: AttentionMetadata, rows: list[int]):
    """The same rows as a batch of their own."""
    qs = [q[meta.qo_indptr_host[b] : meta.qo_indptr_host[b + 1]] for b in rows]
    qo = [0]
    for x in qs:
        qo.append(qo[-1] + x.shape[0])
    lens = [meta.kv_lens_host[b] for b in rows]
    sub = AttentionMetadata(
        qo_indptr=torch.tensor(qo, dtype=torch.int32), kv_lens=torch.tensor(lens, dtype=torch.int32),
        page_table=meta.page_table[rows].contiguous(), page_size=meta.page_size,
        max_q_len=max(x.shape[0] for x in qs), max_kv_len=max(lens), qo_indptr_host=qo, kv_lens_host=lens,
    )  # fmt: skip
    return torch.cat(qs), sub


def test_attention_matches_the_reference_on_a_ragged_batch(ops):
    # a fresh prompt, a prompt chunk after a cached prefix, decode rows of unequal contexts
    q, kv, meta = ragged_batch([(21, 21), (7, 30), (1, 5), (1, 33), (1, 1)])
    ours = ops.attention(q, kv, meta, 0.125)
    assert not ours.isnan().any()
    torch.testing.assert_close(ours, reference.attention(q, kv, meta, 0.125), rtol=1e-5, atol=1e-5)


def test_reference_decode_attention_ignores_nan_padding():
    """The [198, 0, 0, ...] bug: a batched decode row shorter than the longest read NaN keys of the
    uninitialised pool through its padding, and its logits went NaN."""
    q, kv, meta = ragged_batch([(1, 3), (1, 33)])
    out = reference.attention(q, kv, meta, 0.125)
    assert not out.isnan().any()
    alone_q, alone_meta = sub_batch(q, kv, meta, [0])
    torch.testing.assert_close(out[:1], reference.attention(alone_q, kv, alone_meta, 0.125))


def test_attention_rows_and_chunks_do_not_depend_on_the_batch(ops):
    q, kv, meta = ragged_batch([(1, 9), (12, 40), (1, 64), (30, 30)], seed=3)
    batched = ops.attention(q, kv, meta, 0.125)
    for b in range(4):
        qb, mb = sub_batch(q, kv, meta, [b])
        s, e = meta.qo_indptr_host[b], meta.qo_indptr_host[b + 1]
        assert torch.equal(ops.attention(qb, kv, mb, 0.125), batched[s:e])
    # the last 12 queries of row 1 as a 1-token decode row each: the same numbers
    s = meta.qo_indptr_host[1]
    for i in (0, 5, 11):
        ctx = 40 - 12 + i + 1
        one = AttentionMetadata(
            qo_indptr=torch.tensor([0, 1], dtype=torch.int32), kv_lens=torch.tensor([ctx], dtype=torch.int32),
            page_table=meta.page_table[1:2], page_size=meta.page_size, max_q_len=1, max_kv_len=ctx,
            qo_indptr_host=[0, 1], kv_lens_host=[ctx],
        )  # fmt: skip
        assert torch.equal(ops.attention(q[s + i : s + i + 1], kv, one, 0.125), batched[s + i : s + i + 1])


@pytest.mark.skipif(build.requested_tier() == "portable", reason="this CPU's build is the portable one")
def test_simd_build_equals_the_portable_build(ops, portable):
    for qtype in ("Q4_0", "Q4_K", "Q8_0"):
        pw = to_panels(random_blocks(qtype, 80, 512, seed=4))
        for rows in (1, 6):
            x = torch.randn(rows, 512)
            assert torch.equal(ops.linear(x, pw), portable.linear(x, pw)), (qtype, rows)
    x, res, w = torch.randn(5, 576), torch.randn(5, 576), torch.randn(576)
    assert all(
        torch.equal(a, b)
        for a, b in zip(ops.add_rmsnorm(x, res, w, 1e-5), portable.add_rmsnorm(x, res, w, 1e-5))
    )
    gu = torch.randn(5, 3072)
    assert torch.equal(ops.silu_mul(gu), portable.silu_mul(gu))
    q, kv, meta = ragged_batch([(5, 20), (1, 17), (1, 2)], seed=5)
    assert torch.equal(ops.attention(q, kv, meta, 0.125), portable.attention(q, kv, meta, 0.125))


def test_failed_build_falls_back_with_one_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("SGJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="sgjit.kernels.cpp.build"):
        assert build._build("portable") is None
    assert "could not be built" in caplog.text


def test_a_build_killed_midway_does_not_stop_the_next_process(tmp_path):
    """torch's build lock file, left behind by a build that was killed (a server stopped during its
    first start), made every later process wait on it forever. A new process now loads the build
    as usual. Shown on a copy of this process's build with such a leftover lock, in a child process
    under a time limit."""
    built = Path(NATIVE.__file__).parent
    shutil.copytree(built, tmp_path / "cpu_kernels" / built.name)
    (tmp_path / "cpu_kernels" / built.name / "lock").write_text("")
    code = f"from sgjit.kernels.cpp import build; assert build._build({build.requested_tier()!r}) is not None"
    env = {**os.environ, "SGJIT_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=240, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_kernels_off_serves_dequantized_weights_on_torch_ops(monkeypatch):
    import sgjit
    from sgjit.errors import InvalidRequestError

    monkeypatch.setenv("SGJIT_CPU_KERNELS", "off")
    rt = sgjit.Runtime(device="cpu", max_total_tokens=256)
    try:
        assert isinstance(rt.model.layers[0].qkv, torch.Tensor)  # oneDNN's packed fp32 layout
        assert rt.ops.attention is reference.attention
        assert rt.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 3})["output_ids"]
    finally:
        rt.shutdown()
    with pytest.raises(InvalidRequestError, match="quantization 'gguf'"):
        sgjit.Runtime(device="cpu", quantization="gguf")


@pytest.mark.skipif(NATIVE is None, reason="no C++ build on this machine")
def test_seed_cache_gives_another_cache_dir_this_build(tmp_path):
    """A benchmark's or a test's fresh cache dir gets the build (not a rebuild in its first process),
    without the build's lock files, and seeding twice leaves it as it is."""
    build.seed_cache(tmp_path)
    built = Path(NATIVE.__file__)
    copy = tmp_path / "cpu_kernels" / built.parent.name
    assert (copy / built.name).read_bytes() == built.read_bytes()
    assert not (copy / "lock").exists() and not (copy / "build.flock").exists()
    build.seed_cache(tmp_path)
    assert (copy / built.name).exists()
