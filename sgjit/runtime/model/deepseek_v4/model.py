"""The DeepSeek-V4 decoder (`DeepseekV4ForCausalLM`) in torch, over the paged cache of cache.py.

A layer: the hyper-connection streams collapse into the attention's input; attention takes a
low-rank query (q_a, RMSNorm, q_b, a per-head unit RMSNorm) and one shared K=V head, partial RoPE
on their trailing channels, attends (attention.py), rotates its output back by the query's angle
(K=V carried RoPE into the values) and projects it through a grouped low-rank output (each group
of heads to `o_lora_rank`, then one GEMM to hidden); the streams collapse again into the MoE
(moe.py). The GEMMs run through the op table; the rest are torch ops written here and in the
modules beside this one (their reference; no CUDA kernels cover them yet)."""

from __future__ import annotations

import torch

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
from sgjit.runtime.model.deepseek_v4.config import CSA, SLIDING
from sgjit.runtime.model.deepseek_v4.hyper import HyperHead, expand
from sgjit.runtime.model.deepseek_v4.norm import rms_norm, unit_rmsnorm
from sgjit.runtime.model.deepseek_v4.rope import Rotary, inverse_frequencies
from sgjit.runtime.model.deepseek_v4.weights import LayerWeights, WeightSource, load_layer
from sgjit.runtime.model.llama import _WeightTaker


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
        src = WeightSource(take, take32, ops.prepare_weight, self.compress_rope, config.rms_norm_eps)
        self.layers = [load_layer(src, v4, i) for i in range(config.num_layers)]
        self.final_norm = take32("model.norm.weight")
        p = "model.hc_head."
        self.head = HyperHead(take32(p + "hc_fn"), take32(p + "hc_base"), take32(p + "hc_scale"))
        self.lm_head = ops.prepare_weight(
            embed if config.tie_word_embeddings else take.gemm("lm_head.weight")
        )
        weights.pop("lm_head.weight", None)
        take.check_all_used()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, caches: list[DeepseekV4LayerCache]) -> torch.Tensor:
        """Logits (float32) `[len(batch.logits_indices), vocab]` for the selected positions."""
        v4, eps = self.v4, self.config.rms_norm_eps
        plan = build_step_plan(batch.attn, batch.positions, v4, caches[0].kv.shape[1])
        angles = {  # the step's RoPE angles, by rope: sliding layers' and compressed layers'
            "main": self.main_rope.cos_sin(batch.positions),
            "compress": self.compress_rope.cos_sin(batch.positions),
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
        cs = angles["main" if layer.kind == SLIDING else "compress"]
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
