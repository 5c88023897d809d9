"""The lean decode kernel (lean_decode.cu) against the reference op (skipped without a GPU); cases
and oracle as tests/decode_cases.py says. Outputs are allocated on NaN-poisoned memory, so an
element no CTA wrote fails. Beyond the shapes: split merges in a cluster (sm_90) and by the last CTA
(lengths from one key to 32k), the per-pair counters back at zero after every call and every graph
replay, and a graph captured once for a context bound and replayed for other lengths."""

from __future__ import annotations

import random

import pytest
import torch
from decode_cases import BF16, DEV, FP8, FP16, check, config_id, make_case, poison, shapes_of

from sgjit.kernels.arch import device_profile
from sgjit.kernels.spec import Workload
from sgjit.kernels.synthetic import AttentionCase

pytestmark = pytest.mark.gpu


# (dtype, kv dtype, Hq, Hkv, head_dim, page)
CONFIGS = [
    (BF16, BF16, 32, 8, 128, 16),  # Llama-3-8B
    (FP16, FP16, 8, 8, 128, 16),  # MHA: group 1 (8 keys a block, 8 scores a warp)
    (BF16, BF16, 16, 8, 128, 32),  # group 2
    (BF16, BF16, 9, 3, 64, 16),  # SmolLM2: group 3 (laid out as 4)
    (BF16, BF16, 28, 4, 128, 16),  # Qwen2.5-7B: group 7 (laid out as 8, 4 keys a block)
    (FP16, FP16, 32, 2, 64, 8),  # group 16 (2 keys a block)
    (BF16, BF16, 24, 2, 128, 1),  # group 12, one-key pages
    (BF16, FP8, 32, 8, 128, 16),  # fp8 Llama-3-8B
    (FP16, FP8, 16, 4, 64, 64),  # fp8, head_dim 64 (two bytes a lane)
]


@pytest.fixture(scope="module")
def profile():
    return device_profile(DEV)


def _op(profile, cfg, max_cluster: int = 8):
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    return LeanDecode(profile, shapes_of(cfg), max_cluster=max_cluster)


def _run(op, case: AttentionCase) -> torch.Tensor:
    poison(case.q.numel() * case.q.element_size())  # the output lands on NaN-filled memory
    out = op(case.q, case.kv, case.meta, case.q.shape[-1] ** -0.5)
    torch.cuda.synchronize()
    assert int(op.counters.abs().sum()) == 0, "a pair's counter was left non-zero"
    return out


def _batches(rng: random.Random) -> list[tuple[str, list[int]]]:
    return [
        ("one key", [1]),
        ("16 rows of one key", [1] * 16),
        ("block, split and page edges", [7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1, 2]),
        ("one row, 512 keys", [512]),
        ("one row, 4096 keys", [4096]),
        ("8 ragged rows", [rng.randint(1, 4096) for _ in range(8)]),
        ("32k and short", [32768, 1, 5, 100]),
    ]


@pytest.mark.parametrize("max_cluster", [8, 1], ids=["clusters", "global-merge"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_matches_reference(cfg, max_cluster, profile):
    """On sm_90 the default op merges up to 8 splits in a cluster (one row of 512 keys: 8; 8 rows: 2;
    4 rows: 4) and more through global memory (one row of 4096 keys: 16); `global-merge` takes the
    global path for every split count (the only one below sm_90)."""
    op = _op(profile, cfg, max_cluster)
    rng = random.Random(cfg[2] * 100 + cfg[4])
    for i, (what, lens) in enumerate(_batches(rng)):
        case = make_case(cfg, lens, seed=i)
        splits = op.splits(len(lens), max(lens))
        check(_run(op, case), case, f"{what} ({splits} splits, cluster {op.cluster(splits)})")


@pytest.mark.parametrize("max_cluster", [8, 1], ids=["clusters", "global-merge"])
@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_graph_replay_any_lengths(kv_dtype, max_cluster, profile):
    """Captured once for 4 rows under a 4096-key bound through the attention op's lean kernel (its
    own selection rule takes one row under 1024 keys; the test widens it), replayed for other lengths
    written into the same tensors; the counters stay at zero across replays."""
    from sgjit.kernels.cuda.attention import PagedAttention
    from sgjit.kernels.selector import KernelSelector

    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    shapes = shapes_of(cfg)
    t = KernelSelector().select(profile, shapes, Workload(4, 4096))["attention"].tunables
    op = PagedAttention(profile, shapes, BF16, t["decode_tile"], t["prefill_tile"], 4096, lean_decode=True)
    op.lean = _op(profile, cfg, max_cluster)
    op._leans = lambda rows, max_kv_len: True
    assert op.decode_launch(4, 4096)[0] == "lean"
    b = 4
    case = make_case(cfg, [4096] * b)
    scale = 128**-0.5
    op(case.q, case.kv, case.meta, scale)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(case.q, case.kv, case.meta, scale)
    rng = random.Random(7)
    for lens in ([1] * b, [4096] * b, [rng.randint(1, 4096) for _ in range(b)], [4096, 1, 64, 65]):
        case.meta.kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.meta.kv_lens_host[:] = lens
        case.meta.max_kv_len = max(lens)
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
        assert int(op.lean.counters.abs().sum()) == 0
        check(out, case, f"replay with lengths {lens}")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_adversarial_queries_and_keys(kv_dtype, profile):
    """Logits far apart (a near one-hot softmax), nearly equal, all-zero query heads; for fp8, a key
    and value at e4m3's largest."""
    cfg = (BF16, kv_dtype, 32, 8, 128, 16)
    op = _op(profile, cfg)
    lens = [3000, 17, 1, 700]
    for what, q_mul in (("huge queries", 2e3), ("tiny queries", 1e-4)):
        case = make_case(cfg, lens, seed=3)
        case.q.mul_(q_mul)
        check(_run(op, case), case, what)
    case = make_case(cfg, lens, seed=4)
    case.q[:, ::3] = 0
    check(_run(op, case), case, "zero query heads")
    if kv_dtype == FP8:
        case = make_case(cfg, lens, seed=5)
        page = case.meta.page_table[0, 7].item()
        case.kv.k[page, 3].view(torch.uint8).fill_(0x7E)  # +448
        case.kv.v[page, 3].view(torch.uint8).fill_(0xFE)  # -448
        check(_run(op, case), case, "keys and values at e4m3's maximum")


@pytest.mark.parametrize("max_cluster", [8, 1], ids=["clusters", "global-merge"])
@pytest.mark.parametrize("warps", [4, 8])
def test_rows_past_the_launch_bound_are_recut(warps, max_cluster, profile):
    """An eager call whose metadata bound is below a row's length (the splits' keys come from the
    bound): that row is cut evenly over the grid's splits on the device; rows within it keep the
    bound's cut. Both warp counts the benchmark sweeps, both merges."""
    from sgjit.kernels.cuda.lean_decode import LeanDecode

    cfg = (BF16, BF16, 32, 8, 128, 16)
    op = LeanDecode(profile, shapes_of(cfg), warps=warps, max_cluster=max_cluster)
    case = make_case(cfg, [4096, 100, 512, 3000], seed=9)
    case.meta.max_kv_len = 512
    splits = op.splits(4, 512)
    assert splits > 1 and op.split_keys(splits, 512) * splits == 512
    out = _run(op, case)
    case.meta.max_kv_len = 4096  # the reference reads keys up to the metadata's bound
    check(out, case, f"bound 512, {warps} warps, {splits} splits, cluster {op.cluster(splits)}")
