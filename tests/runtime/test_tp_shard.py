"""Tensor-parallel sharding and step messages, without processes: every head, channel and vocabulary
row lands on exactly one rank (KV heads on several when replicated), the ranks' shares put back
together are the checkpoint, splits the heads do not allow are refused by name, and a step survives
the trip through the wire format unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sgjit.errors import UnsupportedModelError
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.runtime.forward_batch import DecodeRows, HostBatch, MultiStep
from sgjit.runtime.model.presets import MODEL_SHAPES, random_weights
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.parallel.shard import ShardPlan, query_heads_per_rank, shard_weights, split_range
from sgjit.runtime.parallel.step import StepChannel, StepKind
from sgjit.runtime.sampler import RowSampling

SMOL = MODEL_SHAPES["smollm2-135m"]  # 9 query / 3 KV heads, vocab 49152
TINY = replace(SMOL, hidden_size=32, intermediate_size=192, num_layers=2, head_dim=8, vocab_size=101)


def config(hq: int, hkv: int):
    return replace(TINY, num_heads=hq, num_kv_heads=hkv)


@pytest.mark.parametrize(
    "hq,hkv,tp,q_per_rank",
    [
        (32, 8, 2, [16, 16]),
        (32, 8, 8, [4] * 8),
        (9, 3, 2, [6, 3]),  # SmolLM2: whole GQA groups, uneven
        (9, 3, 3, [3, 3, 3]),
        (9, 3, 9, [1] * 9),  # each KV head replicated on 3 ranks
        (4, 1, 2, [2, 2]),  # MQA: the one KV head on both ranks
        (8, 2, 4, [2, 2, 2, 2]),
    ],
)
def test_heads_split_into_whole_groups(hq, hkv, tp, q_per_rank):
    cfg = config(hq, hkv)
    plans = [ShardPlan.of(cfg, tp, r) for r in range(tp)]
    assert query_heads_per_rank(cfg, tp) == q_per_rank
    assert sorted(h for p in plans for h in p.q_heads) == list(range(hq))  # each query head once
    group = hq // hkv
    for p in plans:
        assert {h // group for h in p.q_heads} <= set(p.kv_heads)  # a rank has the KV its queries read
        assert p.local_config(cfg).num_heads == len(p.q_heads)
        assert p.local_config(cfg).num_kv_heads == len(p.kv_heads)
    holders = [sum(k in p.kv_heads for p in plans) for k in range(hkv)]
    assert holders == [max(1, tp // hkv)] * hkv  # replicated only where there are fewer KV heads than ranks


@pytest.mark.parametrize(
    "hq,hkv,tp,fits", [(9, 3, 4, "[1, 2, 3, 9]"), (4, 2, 3, "[1, 2, 4]"), (6, 2, 4, "[1, 2, 6]")]
)
def test_a_split_the_heads_do_not_allow_is_refused_with_the_ones_that_work(hq, hkv, tp, fits):
    with pytest.raises(
        UnsupportedModelError, match=rf"tp={tp} cannot split .* use one of tp={fits}".replace("[", r"\[")
    ):
        ShardPlan.of(config(hq, hkv), tp, 0)


def test_split_range_keeps_channel_multiples_and_covers_everything():
    parts = [split_range(1536, 2, r, 64) for r in range(2)]
    assert parts == [range(0, 768), range(768, 1536)]
    parts = [split_range(320, 3, r, 64) for r in range(3)]  # 5 units of 64 over 3 ranks
    assert [len(p) for p in parts] == [128, 128, 64] and parts[-1].stop == 320
    assert [len(split_range(10, 3, r, 64)) for r in range(3)] == [4, 3, 3]  # not a multiple: by one


@pytest.mark.parametrize("tp", [2, 3])
def test_shards_put_back_together_are_the_checkpoint(tp):
    cfg = replace(config(9, 3), qkv_bias=True, qk_norm=True, tie_word_embeddings=False)
    full = random_weights(cfg, seed=1)
    plans = [ShardPlan.of(cfg, tp, r) for r in range(tp)]
    shards = [shard_weights(dict(full), cfg, p) for p in plans]
    d = cfg.head_dim
    for name, w in full.items():
        parts = [s[name] for s in shards]
        if name.endswith(("q_proj.weight", "q_proj.bias", "gate_proj.weight", "up_proj.weight")):
            assert torch.equal(torch.cat(parts), w)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert torch.equal(torch.cat(parts, dim=1), w)
        elif name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            for p, part in zip(plans, parts):
                assert torch.equal(part, w[p.kv_heads.start * d : p.kv_heads.stop * d])
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            joined = torch.cat(parts)  # vocabulary rows, padded with zero rows to equal shares
            assert joined.shape[0] == len(plans[0].vocab) * tp >= cfg.vocab_size
            assert torch.equal(joined[: cfg.vocab_size], w) and not joined[cfg.vocab_size :].any()
        else:  # norms: on every rank
            assert all(part is w for part in parts)
    assert sum(p.num_params(cfg) for p in plans) >= cfg.num_params()


def test_fp8_weights_split_with_their_scales():
    w = Fp8Weight.quantize(torch.randn(16, 24))
    cfg = replace(config(4, 2), hidden_size=24, head_dim=4, intermediate_size=16)
    plan = ShardPlan.of(cfg, 2, 1)
    rows = shard_weights({"model.layers.0.mlp.up_proj.weight": w}, cfg, plan)[
        "model.layers.0.mlp.up_proj.weight"
    ]
    assert torch.equal(rows.dequantize(), w.dequantize()[8:])
    cols = shard_weights({"model.layers.0.mlp.down_proj.weight": w}, cfg, plan)
    assert torch.equal(cols["model.layers.0.mlp.down_proj.weight"].dequantize(), w.dequantize()[:, 8:16])


def test_a_tensor_nobody_knows_how_to_split_is_refused():
    with pytest.raises(
        UnsupportedModelError, match="does not know how to split 'model.layers.0.mlp.experts.0.w1'"
    ):
        shard_weights({"model.layers.0.mlp.experts.0.w1": torch.zeros(4, 4)}, TINY, ShardPlan.of(TINY, 2, 0))


class Loopback(TPGroup):
    """The control group as a queue: what rank 0 broadcasts, the receiving side reads back in order."""

    def __init__(self, wire: list[torch.Tensor]) -> None:
        super().__init__(rank=0, size=2)
        self.wire = wire

    def control_broadcast(self, x: torch.Tensor, idle: bool = False) -> torch.Tensor:
        if self.wire and self.wire[0].shape == x.shape and self.rank == 1:
            x.copy_(self.wire.pop(0))
        else:
            self.wire.append(x.clone())
        return x


STEPS = [
    (
        StepKind.FORWARD,
        (HostBatch([5, 6, 7, 8], [0, 1, 2, 9], [33, 34, 35, 73], [0, 3, 4], [3, 10], [[2], [4, 1]], [2, 3]),),
    ),
    (StepKind.DECODE, (DecodeRows([11, 12], [40, 3], [99, 19], [[6, 7, 8], [1]]),)),
    (StepKind.DECODE_MULTI, (DecodeRows([11], [40], [99], [[6, 7, 8]]), MultiStep([8], [True], None))),
    (
        StepKind.DECODE_MULTI,
        (
            DecodeRows([11, 4], [40, 2], [99, 30], [[6, 7, 8], [2]]),
            MultiStep(
                [3, 8],
                [False, True],
                RowSampling([0.7, 0.0], [0.9, 1.0], [40, -1], [0.0, 0.05], [7, -1], [3, 0]),
            ),
        ),
    ),
    (StepKind.STOP, ()),
]


@pytest.mark.parametrize("kind,step", STEPS, ids=[k.name for k, _ in STEPS])
def test_a_step_message_arrives_as_sent(kind, step):
    wire: list[torch.Tensor] = []
    sender, receiver = Loopback(wire), Loopback(wire)
    receiver.rank = 1
    sender_channel = StepChannel(sender)
    if kind is StepKind.STOP:
        sender_channel._send(kind, [], [])
    else:
        with sender_channel.lead(kind, *step):
            pass
    assert len(wire) <= 3  # a header, then at most one int64 and one float64 payload
    assert StepChannel(receiver).recv() == (kind, step)
    assert not wire
