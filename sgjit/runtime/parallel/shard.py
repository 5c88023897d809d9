"""How a Llama-family model splits over tensor-parallel ranks, decided once from its config
(`ShardPlan`), and the checkpoint's tensors cut to one rank's share (`shard_weights`).

- Attention goes by whole GQA groups (a KV head with the query heads that read it): contiguous
  groups per rank, as evenly as they divide. When they do not divide evenly (SmolLM2's 3 KV heads
  over 2 ranks) the split is uneven rather than refused: the result is exact, and the busiest rank
  (2 groups of 3 query heads against 1) sets the pace. With fewer KV heads than ranks, each KV head
  is replicated on tp/Hkv ranks that split its query heads between them (vLLM's rule); a tp that
  neither divides into nor is a multiple of the KV heads is refused, naming the ones that work.
  Each rank's KV pool holds only its own KV heads.
- q|k|v and gate|up are split by output rows (column-parallel), o_proj and down by input columns
  (row-parallel: each rank's product is a partial sum the ranks all-reduce).
- The embedding and LM head are split by vocabulary rows, padded with zero rows so every rank holds
  the same count (the logits all-gather needs equal parts); the padding is cut off after it.
- Norms are replicated. Any other tensor is refused, so a layer type added later cannot be silently
  copied whole to every rank."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from sgjit.errors import UnsupportedModelError
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.runtime.model.config import ModelConfig

FFN_UNIT = 64  # intermediate channels are split in multiples of this (aligned vector loads in kernels)

# checkpoint name suffix -> how it splits: rows/cols of q heads, kv heads, ffn channels, vocab rows
_SPLITS = {
    "self_attn.q_proj.weight": ("rows", "q"),
    "self_attn.q_proj.bias": ("rows", "q"),
    "self_attn.k_proj.weight": ("rows", "kv"),
    "self_attn.k_proj.bias": ("rows", "kv"),
    "self_attn.v_proj.weight": ("rows", "kv"),
    "self_attn.v_proj.bias": ("rows", "kv"),
    "self_attn.o_proj.weight": ("cols", "q"),
    "mlp.gate_proj.weight": ("rows", "ffn"),
    "mlp.up_proj.weight": ("rows", "ffn"),
    "mlp.down_proj.weight": ("cols", "ffn"),
    "model.embed_tokens.weight": ("rows", "vocab"),
    "lm_head.weight": ("rows", "vocab"),
}


def split_range(n: int, parts: int, index: int, unit: int = 1) -> range:
    """Part `index` of `parts` contiguous, near-equal parts of range(n), cut at multiples of `unit`
    (of 1 where n is not one); the first parts take one unit more where they do not divide."""
    unit = unit if n % unit == 0 else 1
    base, extra = divmod(n // unit, parts)
    start = index * base + min(index, extra)
    return range(start * unit, (start + base + (index < extra)) * unit)


def tp_sizes_that_fit(num_heads: int, num_kv_heads: int) -> list[int]:
    """The tensor-parallel degrees a model's heads allow."""
    group = num_heads // num_kv_heads
    return [
        t for t in range(1, num_heads + 1)
        if t <= num_kv_heads or (t % num_kv_heads == 0 and group % (t // num_kv_heads) == 0)
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ShardPlan:
    rank: int
    size: int
    q_heads: range
    kv_heads: range
    ffn: range
    vocab: range  # the rank's vocabulary rows; past the vocabulary's end they are zero padding
    vocab_size: int

    @classmethod
    def of(cls, config: ModelConfig, size: int, rank: int) -> ShardPlan:
        hq, hkv = config.num_heads, config.num_kv_heads
        if size > 1 and (config.moe is not None or config.deepseek_v4 is not None):
            raise UnsupportedModelError(
                f"tensor parallelism splits dense Llama-family models; {config.name or 'this model'} has "
                "mixture-of-experts layers, which are not split yet: serve it with tp=1"
            )
        if size not in tp_sizes_that_fit(hq, hkv):
            raise UnsupportedModelError(
                f"tp={size} cannot split {config.name or 'this model'}'s {hq} query / {hkv} KV heads: each "
                f"rank needs whole KV heads, or an equal share of one KV head's {hq // hkv} query heads; "
                f"use one of tp={tp_sizes_that_fit(hq, hkv)}"
            )
        q_heads, kv_heads = _heads(hq, hkv, size, rank)
        rows = -(-config.vocab_size // size)
        return cls(
            rank=rank,
            size=size,
            q_heads=q_heads,
            kv_heads=kv_heads,
            ffn=split_range(config.intermediate_size, size, rank, FFN_UNIT),
            vocab=range(rank * rows, (rank + 1) * rows),
            vocab_size=config.vocab_size,
        )

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The rank's model: its heads and MLP channels; the vocabulary stays whole (its logits are
        gathered to the whole vocabulary)."""
        return replace(
            config,
            num_heads=len(self.q_heads),
            num_kv_heads=len(self.kv_heads),
            intermediate_size=len(self.ffn),
        )

    def num_params(self, config: ModelConfig) -> int:
        """Parameters this rank holds (its vocabulary rows, padding included)."""
        return replace(self.local_config(config), vocab_size=len(self.vocab)).num_params()


def query_heads_per_rank(config: ModelConfig, size: int) -> list[int]:
    """How many query heads each rank computes (unequal where the KV heads do not divide evenly)."""
    return [len(ShardPlan.of(config, size, r).q_heads) for r in range(size)]


def _heads(hq: int, hkv: int, size: int, rank: int) -> tuple[range, range]:
    group = hq // hkv
    if size <= hkv:
        kv = split_range(hkv, size, rank)
        return range(kv.start * group, kv.stop * group), kv
    replicas = size // hkv
    kv_head, part = divmod(rank, replicas)
    per = group // replicas
    start = kv_head * group + part * per
    return range(start, start + per), range(kv_head, kv_head + 1)


def shard_weights(weights: dict, config: ModelConfig, plan: ShardPlan) -> dict:
    """The rank's share of a checkpoint's tensors, under the same names; each a copy, so the whole
    tensor is freed once the caller drops it."""
    d = config.head_dim
    spans = {
        "q": slice(plan.q_heads.start * d, plan.q_heads.stop * d),
        "kv": slice(plan.kv_heads.start * d, plan.kv_heads.stop * d),
        "ffn": slice(plan.ffn.start, plan.ffn.stop),
    }
    out = {}
    for name, w in weights.items():
        how = next((v for k, v in _SPLITS.items() if name.endswith(k)), None)
        if how is None:
            if isinstance(w, torch.Tensor) and w.dim() <= 1:  # norms (and rotary tables) are replicated
                out[name] = w
                continue
            raise UnsupportedModelError(f"tensor parallelism does not know how to split {name!r}")
        axis, part = how
        if part == "vocab":
            out[name] = _vocab_rows(w, plan)
        elif axis == "rows":
            out[name] = _rows(w, spans[part])
        else:
            out[name] = _cols(w, spans[part])
    return out


def _rows(w: object, rows: slice) -> torch.Tensor | Fp8Weight:
    if isinstance(w, Fp8Weight):
        return Fp8Weight(w.data[rows].clone(), w.scale[rows].clone())
    return _dense(w)[rows].clone()


def _cols(w: object, cols: slice) -> torch.Tensor | Fp8Weight:
    if isinstance(w, Fp8Weight):  # one scale per output row: the rows keep theirs
        return Fp8Weight(w.data[:, cols].contiguous(), w.scale.clone())
    return _dense(w)[:, cols].contiguous()


def _vocab_rows(w: object, plan: ShardPlan) -> torch.Tensor | Fp8Weight:
    stop = min(plan.vocab.stop, plan.vocab_size)
    if isinstance(w, Fp8Weight):
        data = w.data.new_zeros(len(plan.vocab), w.data.shape[1])
        data[: stop - plan.vocab.start] = w.data[plan.vocab.start : stop]
        scale = w.scale.new_ones(len(plan.vocab))
        scale[: stop - plan.vocab.start] = w.scale[plan.vocab.start : stop]
        return Fp8Weight(data, scale)
    w = _dense(w)
    out = w.new_zeros(len(plan.vocab), w.shape[1])
    out[: stop - plan.vocab.start] = w[plan.vocab.start : stop]
    return out


def _dense(w: object) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise UnsupportedModelError(
            f"tensor parallelism splits dense and FP8 weights, not {type(w).__name__} ones; "
            "load the model with quantization 'none' or 'auto'"
        )
    return w
