"""The decode megakernel (megakernel.cu through DecodeMegakernel) on a GPU, at SmolLM2-135M's shape with
random weights (random norm weights too): 64 decode steps of 1, 2 and 8 rows whose contexts cross page
boundaries, teacher-forced on the layered kernels' greedy tokens, against the layered fused kernels
and a float32 oracle; the first step's KV writes bit for bit the layered ones; CUDA-graph replay bit
for bit the eager launches, with the barrier counter left as the next launch needs it. Skipped without a GPU.

The megakernel runs the fused ops' GEMV bodies, so its projections round as theirs do; its attention
is its own (float32 on CUDA cores), so its logits differ from the layered ones by bf16 noise and its
greedy token may differ from theirs at near-ties that this noise explains (measured as in
test_fused_gemv_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from model_steps import Side, random_model_weights, teacher_forced

from sgjit.kernels.ops import OpTable

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
STEPS = 64
PROMPTS = (5, 16, 17, 31, 33, 64, 100, 250)  # at, just past, far past page boundaries (16-token pages)


class Counting:
    """The table's megakernel op, counting the steps it served (a None is a step it refused)."""

    def __init__(self, op) -> None:
        self.op, self.served = op, 0

    def __call__(self, *args):
        out = self.op(*args)
        self.served += out is not None
        return out


@pytest.fixture(scope="module")
def setup():
    """SmolLM2-135M with random weights, its kernel table with the megakernel (attention on its
    GPU-verified kernels), and a float32 oracle."""
    from sgjit.kernels.arch import device_profile
    from sgjit.kernels.reference import REFERENCE_OPS
    from sgjit.kernels.selector import KernelSelector
    from sgjit.kernels.spec import KernelChoice, ModelShapes, Workload
    from sgjit.kernels.table import build_ops
    from sgjit.runtime.model.llama import LlamaModel
    from sgjit.runtime.model.presets import shape_config

    cfg = shape_config("smollm2-135m")
    weights = random_model_weights(cfg, DEV, seed=2, norm_seed=3, norm_spread=0.2)
    exact = {k: v.float() for k, v in weights.items()}
    profile = device_profile(DEV)
    shapes = ModelShapes.from_config(cfg, torch.bfloat16, torch.bfloat16, 16)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGJIT_UNVERIFIED_KERNELS", "1")
        mp.setenv("SGJIT_KERNELS", "auto")
        ks = KernelSelector().select(profile, shapes, Workload(8, 4096))
        assert ks["decode_megakernel"].variant == "cuda", ks["decode_megakernel"].reason
        attn = ks["attention"]
        verified = {k: v for k, v in attn.tunables.items() if k not in ("stream_decode", "prefill_sm90")}
        ks = type(ks)(
            {**ks.choices, "attention": KernelChoice(attn.variant, verified, "test")}, shapes, ks.workload
        )
        ops = build_ops(profile, shapes, ks)
    assert type(ops.decode_megakernel).__name__ == "GuardedOp" and ops.fused_rows > 0
    model = LlamaModel(cfg, weights, ops, DEV, torch.bfloat16, max_positions=4096)
    oracle = LlamaModel(cfg, exact, REFERENCE_OPS, DEV, torch.float32, max_positions=4096)
    return model, ops, oracle, REFERENCE_OPS


@pytest.mark.parametrize("rows", [1, 2, 8])
def test_megakernel_decode_matches_the_layered_kernels(setup, rows):
    model, ops, oracle, ref_ops = setup
    mega_op = Counting(ops.decode_megakernel)
    prompts = PROMPTS[:rows] if rows > 1 else (33,)
    max_tokens = max(prompts) + STEPS + 1
    mega = Side(model, ops.with_overrides(decode_megakernel=mega_op), rows, max_tokens)
    layered = Side(model, ops.with_overrides(decode_megakernel=None), rows, max_tokens)
    f32 = Side(oracle, ref_ops, rows, max_tokens)
    gen = torch.Generator().manual_seed(4 + rows)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in prompts]
    for side in (mega, layered, f32):
        side.step(seqs, [0] * rows)  # prefill: layered on every side
    assert mega_op.served == 0

    def same_layer0_kv(step: int, starts: list[int]) -> None:
        if step == 0:  # layer 0's new keys and values: same inputs, same GEMV, same rounding
            slots = [p[n // 16] * 16 + n % 16 for p, n in zip(mega.pages, starts)]
            k0m, k0l = mega.pool.layers[0].k.view(-1, 3, 64), layered.pool.layers[0].k.view(-1, 3, 64)
            v0m, v0l = mega.pool.layers[0].v.view(-1, 3, 64), layered.pool.layers[0].v.view(-1, 3, 64)
            assert torch.equal(k0m[slots], k0l[slots]) and torch.equal(v0m[slots], v0l[slots])

    got = teacher_forced(mega, layered, f32, seqs, STEPS, same_layer0_kv)
    assert mega_op.served == STEPS and not ops.decode_megakernel.failed
    print(f"\nrows {rows} ({STEPS * rows} tokens): " + got.summary("megakernel", "layered"))
    got.assert_within_noise()


def test_megakernel_graph_replay_is_the_eager_launch(setup):
    """Decode steps captured in CUDA graphs (DecodeGraphs) give the eager launches' logits bit for bit,
    step after step, so the barrier state carries over replays as they do over launches."""
    from sgjit.runtime.cuda_graph import DecodeGraphs
    from sgjit.runtime.futures import TokenFutures

    model, ops, _, _ = setup
    rows, prompts = 2, (30, 47)
    max_tokens = max(prompts) + 17
    eager = Side(model, ops, rows, max_tokens)
    graphed = Side(model, ops, rows, max_tokens)
    gen = torch.Generator().manual_seed(9)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in prompts]
    for side in (eager, graphed):
        side.step(seqs, [0, 0])
    model.ops = ops
    futures = TokenFutures(1, rows, torch.device("cuda"))
    graphs = DecodeGraphs(model, graphed.pool, futures, max_bs=rows, max_context=512)
    tokens = [1, 2]
    for _ in range(16):
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, tokens):
            s.append(t)
        want = eager.step(seqs, starts)
        slots = [p[n // 16] * 16 + n % 16 for p, n in zip(graphed.pages, starts)]
        model.ops = ops
        got = graphs.run(tokens, starts, slots, graphed.pages).clone()
        assert torch.equal(got, want)
        tokens = want.argmax(-1).tolist()
    assert graphs.num_graphs == 1 and not ops.decode_megakernel.failed
    barriers = 1 + 5 * model.config.num_layers  # a launch's
    for inst in ops.decode_megakernel.fn._instances.values():
        assert inst.barrier.item() % (inst.grid * barriers) == 0


def test_megakernel_refuses_what_it_does_not_serve(setup):
    """A prefill, or more rows than it was built for: None, and the model runs its layers."""
    model, ops, _, _ = setup
    assert isinstance(ops, OpTable)
    rows = ops.decode_megakernel.fn.rows + 1
    side = Side(model, ops.with_overrides(decode_megakernel=Counting(ops.decode_megakernel)), rows, 64)
    gen = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, model.config.vocab_size, (5,), generator=gen).tolist() for _ in range(rows)]
    side.step(seqs, [0] * rows)
    for s in seqs:
        s.append(3)
    side.step(seqs, [5] * rows)
    assert side.ops.decode_megakernel.served == 0 and not ops.decode_megakernel.failed
