"""DeepSeek-V4's weights as the model holds them, taken by name from the checkpoint (transformers'
module names, which the loader produces): GEMM weights prepared for the op table, norms,
hyper-connection mixes, sinks and gate biases in float32 (as transformers keeps them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sgjit.errors import ModelFormatError
from sgjit.kernels.ops import PrepareWeight
from sgjit.runtime.model.deepseek_v4.compressor import Compressor
from sgjit.runtime.model.deepseek_v4.config import CSA, HASH_MOE, DeepseekV4Config
from sgjit.runtime.model.deepseek_v4.hyper import HyperConnection
from sgjit.runtime.model.deepseek_v4.moe import DeepseekV4MoE
from sgjit.runtime.model.deepseek_v4.rope import Rotary
from sgjit.runtime.model.llama import _WeightTaker


@dataclass(slots=True)
class Indexer:
    compressor: Compressor  # its keys: dim index_head_dim, overlapping windows
    q_b: Any  # [heads * index_head_dim, q_lora_rank]
    head_weights: Any  # [heads, hidden]


@dataclass(slots=True)
class AttentionWeights:
    q_a: Any  # [q_lora_rank, hidden]
    q_a_norm: torch.Tensor
    q_b: Any  # [heads * head_dim, q_lora_rank]
    kv: Any  # [head_dim, hidden]
    kv_norm: torch.Tensor
    o_a: torch.Tensor  # [groups, o_lora_rank, heads * head_dim / groups]
    o_b: Any  # [hidden, groups * o_lora_rank]
    sinks: torch.Tensor  # float32 [heads]
    compressor: Compressor | None  # CSA and HCA layers
    indexer: Indexer | None  # CSA layers


@dataclass(slots=True)
class LayerWeights:
    kind: str  # SLIDING, CSA or HCA
    rate: int  # tokens per compressed entry (0: sliding)
    attn_hc: HyperConnection
    attn_norm: torch.Tensor
    attn: AttentionWeights
    ffn_hc: HyperConnection
    ffn_norm: torch.Tensor
    moe: DeepseekV4MoE


@dataclass(slots=True)
class WeightSource:
    """Takes tensors by name: `take` in the compute dtype, `take32` in float32 (both pop from one
    checkpoint dict), `prep` readies a GEMM weight for the op table."""

    take: _WeightTaker
    take32: _WeightTaker
    prep: PrepareWeight
    compress_rope: Rotary
    eps: float

    def gemm(self, name: str) -> Any:
        return self.prep(self.take.gemm(name))


def load_layer(src: WeightSource, v4: DeepseekV4Config, i: int) -> LayerWeights:
    take, take32 = src.take, src.take32
    p = f"model.layers.{i}."
    a = p + "self_attn."
    kind, rate = v4.layer_types[i], v4.compress_rate(i)
    o_a = take(a + "o_a_proj.weight")
    attn = AttentionWeights(
        q_a=src.gemm(a + "q_a_proj.weight"),
        q_a_norm=take32(a + "q_a_norm.weight"),
        q_b=src.gemm(a + "q_b_proj.weight"),
        kv=src.gemm(a + "kv_proj.weight"),
        kv_norm=take32(a + "kv_norm.weight"),
        o_a=o_a.view(v4.o_groups, v4.o_lora_rank, o_a.shape[1]),
        o_b=src.gemm(a + "o_b_proj.weight"),
        sinks=take32(a + "sinks"),
        compressor=_compressor(src, a + "compressor.") if rate else None,
        indexer=None,
    )
    if kind == CSA:
        x = a + "compressor.indexer."
        attn.indexer = Indexer(
            _compressor(src, x), src.gemm(x + "q_b_proj.weight"), src.gemm(x + "scorer.weights_proj.weight")
        )
    return LayerWeights(
        kind=kind,
        rate=rate,
        attn_hc=_hyper(take32, p + "attn_hc."),
        attn_norm=take32(p + "input_layernorm.weight"),
        attn=attn,
        ffn_hc=_hyper(take32, p + "ffn_hc."),
        ffn_norm=take32(p + "post_attention_layernorm.weight"),
        moe=_moe(src, v4, i),
    )


def _compressor(src: WeightSource, p: str) -> Compressor:
    return Compressor(
        kv=src.gemm(p + "kv_proj.weight"),
        gate=src.gemm(p + "gate_proj.weight"),
        position_bias=src.take32(p + "position_bias"),
        norm=src.take32(p + "kv_norm.weight"),
        rotary=src.compress_rope,
        eps=src.eps,
    )


def _hyper(take32: _WeightTaker, p: str) -> HyperConnection:
    return HyperConnection(take32(p + "fn"), take32(p + "base"), take32(p + "scale"))


def _moe(src: WeightSource, v4: DeepseekV4Config, i: int) -> DeepseekV4MoE:
    take = src.take
    p = f"model.layers.{i}.mlp."
    s = p + "shared_experts."
    moe = DeepseekV4MoE(
        router=src.take32(p + "gate.weight"),
        gate_up=take(p + "experts.gate_up_proj"),
        down=take(p + "experts.down_proj"),
        shared_gate_up=src.prep(torch.cat([take(s + "gate_proj.weight"), take(s + "up_proj.weight")])),
        shared_down=src.gemm(s + "down_proj.weight"),
        top_k=v4.top_k,
        scoring_func=v4.scoring_func,
        routed_scaling_factor=v4.routed_scaling_factor,
        swiglu_limit=v4.swiglu_limit,
    )
    if v4.mlp_layer_types[i] == HASH_MOE:
        table = take.weights.pop(p + "gate.tid2eid", None)
        if table is None:
            raise ModelFormatError(f"hash-routed layer {i} has no token-to-expert table {p}gate.tid2eid")
        moe.token_experts = table.to(take.device, torch.int64)
    else:
        moe.score_bias = src.take32(p + "gate.e_score_correction_bias")
    return moe
