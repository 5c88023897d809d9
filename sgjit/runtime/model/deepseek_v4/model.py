"""The DeepSeek-V4 decoder (`DeepseekV4ForCausalLM`) in torch, over the paged cache of cache.py.

A layer: the hyper-connection streams collapse into the attention's input; attention takes a
low-rank query (q_a, RMSNorm, q_b, a per-head unit RMSNorm) and one shared K=V head, partial RoPE
on their trailing channels, attends (attention.py), rotates its output back by the query's angle
(K=V carried RoPE into the values) and projects it through a grouped low-rank output (each group
of heads to `o_lora_rank`, then one GEMM to hidden); the streams collapse again into the MoE
(moe.py). The GEMMs run through the op table; the rest are torch ops written here and in the
modules beside this one (their reference; no CUDA kernels cover them yet)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sgjit.errors import ModelFormatError
from sgjit.kernels.ops import OpTable
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.deepseek_v4.attention import (
    StepPlan,
    attend,
    build_step_plan,
    finished,
    indexer_pick,
)
from sgjit.runtime.model.deepseek_v4.cache import DeepseekV4LayerCache
from sgjit.runtime.model.deepseek_v4.compressor import Compressor
from sgjit.runtime.model.deepseek_v4.config import CSA, HASH_MOE, SLIDING
from sgjit.runtime.model.deepseek_v4.hyper import HyperConnection, HyperHead, expand
from sgjit.runtime.model.deepseek_v4.moe import DeepseekV4MoE
from sgjit.runtime.model.deepseek_v4.norm import rms_norm, unit_rmsnorm
from sgjit.runtime.model.deepseek_v4.rope import Rotary, inverse_frequencies
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


class DeepseekV4Model:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        ops: OpTable,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        assert config.deepseek_v4 is not None
        self.config, self.v4 = config, config.deepseek_v4
        self.ops, self.device, self.dtype = ops, device, dtype
        v4 = self.v4
        self.main_rope = Rotary(inverse_frequencies(v4.rope_theta, v4.rope_head_dim).to(device))
        self.compress_rope = Rotary(
            inverse_frequencies(v4.compress_rope_theta, v4.rope_head_dim, v4.compress_yarn).to(device)
        )
        take = _WeightTaker(weights, device, dtype)
        take32 = _WeightTaker(weights, device, torch.float32)  # what transformers keeps in float32
        embed = take.gemm("model.embed_tokens.weight")
        self.embed = take.dense(embed)
        self.layers = [self._layer(take, take32, i) for i in range(config.num_layers)]
        self.final_norm = take32("model.norm.weight")
        p = "model.hc_head."
        self.head = HyperHead(take32(p + "hc_fn"), take32(p + "hc_base"), take32(p + "hc_scale"))
        self.lm_head = ops.prepare_weight(
            embed if config.tie_word_embeddings else take.gemm("lm_head.weight")
        )
        weights.pop("lm_head.weight", None)
        take.check_all_used()

    def _layer(self, take: _WeightTaker, take32: _WeightTaker, i: int) -> LayerWeights:
        v4, prep = self.v4, self.ops.prepare_weight
        p = f"model.layers.{i}."
        a = p + "self_attn."
        kind, rate = v4.layer_types[i], v4.compress_rate(i)
        o_a = take(a + "o_a_proj.weight")
        attn = AttentionWeights(
            q_a=prep(take.gemm(a + "q_a_proj.weight")),
            q_a_norm=take32(a + "q_a_norm.weight"),
            q_b=prep(take.gemm(a + "q_b_proj.weight")),
            kv=prep(take.gemm(a + "kv_proj.weight")),
            kv_norm=take32(a + "kv_norm.weight"),
            o_a=o_a.view(v4.o_groups, v4.o_lora_rank, o_a.shape[1]),
            o_b=prep(take.gemm(a + "o_b_proj.weight")),
            sinks=take32(a + "sinks"),
            compressor=self._compressor(take, take32, a + "compressor.") if rate else None,
            indexer=None,
        )
        if kind == CSA:
            x = a + "compressor.indexer."
            attn.indexer = Indexer(
                self._compressor(take, take32, x),
                prep(take.gemm(x + "q_b_proj.weight")),
                prep(take.gemm(x + "scorer.weights_proj.weight")),
            )
        return LayerWeights(
            kind=kind,
            rate=rate,
            attn_hc=self._hyper(take32, p + "attn_hc."),
            attn_norm=take32(p + "input_layernorm.weight"),
            attn=attn,
            ffn_hc=self._hyper(take32, p + "ffn_hc."),
            ffn_norm=take32(p + "post_attention_layernorm.weight"),
            moe=self._moe(take, take32, i),
        )

    def _compressor(self, take: _WeightTaker, take32: _WeightTaker, p: str) -> Compressor:
        prep = self.ops.prepare_weight
        return Compressor(
            kv=prep(take.gemm(p + "kv_proj.weight")),
            gate=prep(take.gemm(p + "gate_proj.weight")),
            position_bias=take32(p + "position_bias"),
            norm=take32(p + "kv_norm.weight"),
            rotary=self.compress_rope,
            eps=self.config.rms_norm_eps,
        )

    @staticmethod
    def _hyper(take32: _WeightTaker, p: str) -> HyperConnection:
        return HyperConnection(take32(p + "fn"), take32(p + "base"), take32(p + "scale"))

    def _moe(self, take: _WeightTaker, take32: _WeightTaker, i: int) -> DeepseekV4MoE:
        v4, prep = self.v4, self.ops.prepare_weight
        p = f"model.layers.{i}.mlp."
        s = p + "shared_experts."
        shared_gate_up = torch.cat([take(s + "gate_proj.weight"), take(s + "up_proj.weight")])
        moe = DeepseekV4MoE(
            router=take32(p + "gate.weight"),
            gate_up=take(p + "experts.gate_up_proj"),
            down=take(p + "experts.down_proj"),
            shared_gate_up=prep(shared_gate_up),
            shared_down=prep(take.gemm(s + "down_proj.weight")),
            top_k=v4.top_k,
            scoring_func=v4.scoring_func,
            routed_scaling_factor=v4.routed_scaling_factor,
            swiglu_limit=v4.swiglu_limit,
        )
        if v4.mlp_layer_types[i] == HASH_MOE:
            table = take.weights.pop(p + "gate.tid2eid", None)
            if table is None:
                raise ModelFormatError(f"hash-routed layer {i} has no token-to-expert table {p}gate.tid2eid")
            moe.token_experts = table.to(self.device, torch.int64)
        else:
            moe.score_bias = take32(p + "gate.e_score_correction_bias")
        return moe

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, caches: list[DeepseekV4LayerCache]) -> torch.Tensor:
        """Logits (float32) `[len(batch.logits_indices), vocab]` for the selected positions."""
        v4, eps = self.v4, self.config.rms_norm_eps
        plan = build_step_plan(batch.attn, batch.positions, v4, caches[0].kv.shape[1])
        angles = {
            SLIDING: self.main_rope.cos_sin(batch.positions),
            CSA: self.compress_rope.cos_sin(batch.positions),
        }
        embedded = self.embed[batch.input_ids]
        streams = embedded.unsqueeze(1).expand(-1, v4.hc_mult, -1).contiguous()
        for layer, cache in zip(self.layers, caches):
            x, post, comb = layer.attn_hc.mixes(streams, v4.hc_sinkhorn_iters, v4.hc_eps, eps)
            out = self._attention(layer, rms_norm(x, layer.attn_norm, eps), batch, plan, cache, angles)
            streams = expand(out, streams, post, comb)
            x, post, comb = layer.ffn_hc.mixes(streams, v4.hc_sinkhorn_iters, v4.hc_eps, eps)
            out = layer.moe(self.ops, rms_norm(x, layer.ffn_norm, eps), batch.input_ids)
            streams = expand(out, streams, post, comb)
        x = self.head(streams[batch.logits_indices], v4.hc_eps, eps)
        return self.ops.linear(rms_norm(x, self.final_norm, eps), self.lm_head, None).float()

    def _attention(
        self,
        layer: LayerWeights,
        x: torch.Tensor,
        batch: ForwardBatch,
        plan: StepPlan,
        cache: DeepseekV4LayerCache,
        angles: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        ops, v4, cfg, w = self.ops, self.v4, self.config, layer.attn
        eps, n, heads, d = cfg.rms_norm_eps, x.shape[0], cfg.num_heads, cfg.head_dim
        rope = self.main_rope if layer.kind == SLIDING else self.compress_rope
        cs = angles[SLIDING if layer.kind == SLIDING else CSA]
        q_low = rms_norm(ops.linear(x, w.q_a, None), w.q_a_norm, eps)
        q = rope.apply(unit_rmsnorm(ops.linear(q_low, w.q_b, None).view(n, heads, d), eps), cs)
        kv = rope.apply(rms_norm(ops.linear(x, w.kv, None), w.kv_norm, eps), cs)
        flat_kv = cache.kv.view(-1, d)
        flat_kv[batch.slot_mapping] = kv.to(flat_kv.dtype)
        if w.compressor is not None:
            w.compressor(ops, x, plan.pools[layer.kind], cache.compressed)
        if w.indexer is not None:
            w.indexer.compressor(ops, x, plan.pools[CSA], cache.index)
            index_q = ops.linear(q_low, w.indexer.q_b, None).view(n, v4.index_n_heads, v4.index_head_dim)
            index_q = self.compress_rope.apply(index_q, cs)
            head_weights = ops.linear(x, w.indexer.head_weights, None).float() * v4.index_n_heads**-0.5
        out = torch.empty_like(q)
        for g in plan.groups:
            keys = flat_kv[g.kv_slots]
            qp, kp = g.q_pos[:, :, None], g.kv_pos[:, None, :]
            visible = (kp <= qp) & (kp > qp - v4.sliding_window)
            if layer.rate:
                slots = g.entries[layer.rate][0]
                seen = finished(g, layer.rate)
                if layer.kind == CSA:
                    idx = g.q_index
                    seen = indexer_pick(
                        index_q[idx], head_weights[idx], cache.index.entries[slots], seen, v4.index_topk
                    )
                keys = torch.cat([keys, cache.compressed.entries[slots]], dim=1)
                visible = torch.cat([visible, seen], dim=-1)
            o = attend(q[g.q_index], keys, visible, w.sinks, d**-0.5)
            out[g.q_index[g.q_valid]] = o[g.q_valid]
        out = rope.apply(out, cs, inverse=True)
        grouped = torch.einsum("ngi,goi->ngo", out.reshape(n, v4.o_groups, -1), w.o_a).reshape(n, -1)
        return ops.linear(grouped, w.o_b, None)
