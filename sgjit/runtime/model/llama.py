"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, and the MoE families Mixtral,
Qwen2-MoE, Qwen3-MoE) in torch. Every op goes through the ops table; the weights are fused at load
(q|k|v and gate|up) so a dense layer is four GEMMs. A layer's feed-forward is a dense MLP (mlp.py)
or a sparse MoE block (moe.py); attention is the same in all. A decode step runs a dense layer as
the table's fused ops (norm, RoPE, activation and residual adds inside the GEMMs) where it has them,
or, where the table has a decode megakernel that takes the step, the whole step as that one op."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sgjit.errors import ModelFormatError
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.ops import DecodeLayerWeights, DecodeWeights, LayerKV, OpTable
from sgjit.kernels.quant import QuantWeight
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.mlp import DenseMLP
from sgjit.runtime.model.moe import FeedForward, load_feed_forward
from sgjit.runtime.model.rope import cos_sin_table
from sgjit.runtime.parallel.comm import ModelComm


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: Any  # [q_size + 2 kv_size, hidden], as ops.prepare_weight left it (so are the other GEMM weights)
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: Any
    ffn_norm: torch.Tensor
    mlp: FeedForward


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        ops: OpTable,
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int | None = None,
        rope_freq_factors: torch.Tensor | None = None,
        fp8_weights: bool = False,
        comm: ModelComm | None = None,
    ) -> None:
        """`fp8_weights`: the layers' GEMM weights as FP8 with per-channel scales (quantized here
        when the checkpoint holds them in 16/32 bits); otherwise FP8 checkpoint weights are
        dequantized. Embeddings and the LM head keep the compute dtype. Under tensor parallelism
        `config` and `weights` are one rank's share (parallel/shard.py) and `comm` joins the ranks."""
        self.config = config
        self.comm = comm or ModelComm()
        self.ops = ops
        self.device = device
        self.dtype = dtype
        self.scale = config.head_dim**-0.5
        take = _WeightTaker(weights, device, dtype, fp8_weights)
        embed = take.gemm("model.embed_tokens.weight")
        self.embed = take.dense(embed)  # rows gathered by token id
        self.layers = [self._layer(take, i) for i in range(config.num_layers)]
        self.final_norm = take("model.norm.weight")
        self.lm_head = ops.prepare_weight(
            embed if config.tie_word_embeddings else take.gemm("lm_head.weight")
        )
        if "lm_head.weight" in weights and config.tie_word_embeddings:
            weights.pop("lm_head.weight")
        take.check_all_used()
        self.cos_sin = cos_sin_table(
            config.rope, max_positions or config.max_position_embeddings, device, rope_freq_factors
        )
        self.decode_weights = self._decode_weights()

    def _decode_weights(self) -> DecodeWeights | None:
        """The step as a decode megakernel takes it: a dense model without per-head q/k norms on one
        process (under tensor parallelism the partial sums need all-reduces between the GEMMs)."""
        if self.comm.parallel or not all(
            isinstance(layer.mlp, DenseMLP) and layer.q_norm is None for layer in self.layers
        ):
            return None
        layers = [
            DecodeLayerWeights(
                layer.attn_norm,
                layer.qkv,
                layer.qkv_bias,
                layer.o_proj,
                layer.ffn_norm,
                layer.mlp.gate_up,
                layer.mlp.down,
            )
            for layer in self.layers
        ]
        return DecodeWeights(
            self.embed,
            layers,
            self.final_norm,
            self.lm_head,
            self.cos_sin,
            self.config.rms_norm_eps,
            self.scale,
        )

    def _layer(self, take: _WeightTaker, i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        cfg = self.config
        q, k, v = (take.layer_gemm(f"{p}self_attn.{n}_proj.weight") for n in "qkv")
        bias = None
        if cfg.qkv_bias:
            bias = torch.cat([take(f"{p}self_attn.{n}_proj.bias") for n in "qkv"])
        prep = self.ops.prepare_weight
        return LayerWeights(
            attn_norm=take(f"{p}input_layernorm.weight"),
            qkv=prep(take.stack([q, k, v])),
            qkv_bias=bias,
            q_norm=take(f"{p}self_attn.q_norm.weight") if cfg.qk_norm else None,
            k_norm=take(f"{p}self_attn.k_norm.weight") if cfg.qk_norm else None,
            o_proj=prep(take.layer_gemm(f"{p}self_attn.o_proj.weight")),
            ffn_norm=take(f"{p}post_attention_layernorm.weight"),
            mlp=load_feed_forward(take, cfg, i, prep),
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_layers: list[LayerKV]) -> torch.Tensor:
        """Logits (float32) `[len(batch.logits_indices), vocab]` for the selected positions. A decode
        step the table's megakernel takes is one launch; otherwise a step of at most `ops.fused_rows`
        tokens runs each layer as the fused ops, the others as the unfused ones; all three compute the
        same roundings."""
        ops, eps = self.ops, self.config.rms_norm_eps
        mega = ops.decode_megakernel
        if mega is not None and self.decode_weights is not None and batch.attn.is_decode:
            logits = mega(
                self.decode_weights,
                batch.input_ids,
                batch.positions,
                batch.slot_mapping,
                kv_layers,
                batch.attn,
            )
            if logits is not None:  # one token a row: the logits rows are the step's rows
                return logits
        hidden = self.comm.embed(self.embed, batch.input_ids)
        cos_sin = self.cos_sin[batch.positions]  # once per step, shared by every layer
        # the fused ops add the residual inside the row-parallel GEMMs: under tensor parallelism the
        # partial sums must be all-reduced first, so its steps run the unfused ops
        if batch.num_tokens <= ops.fused_rows and not self.comm.parallel:
            residual = hidden
            for layer, kv in zip(self.layers, kv_layers):
                residual = self._fused_layer(layer, residual, cos_sin, kv, batch)
            x = residual[batch.logits_indices]
            return ops.rmsnorm_linear(x, self.final_norm, eps, self.lm_head, None).float()
        residual = hidden
        x = ops.rmsnorm(hidden, self.layers[0].attn_norm, eps)
        for i, (layer, kv) in enumerate(zip(self.layers, kv_layers)):
            if i > 0:
                x, residual = ops.add_rmsnorm(hidden, residual, layer.attn_norm, eps)
            q = self._rope(ops.linear(x, layer.qkv, layer.qkv_bias), layer, cos_sin, kv, batch)
            attn = ops.attention(q, kv, batch.attn, self.scale)
            hidden = self.comm.reduce(
                ops.linear(attn.reshape(batch.num_tokens, self.config.q_size), layer.o_proj, None)
            )
            x, residual = ops.add_rmsnorm(hidden, residual, layer.ffn_norm, eps)
            hidden = self.comm.reduce(layer.mlp(ops, x))
        x, _ = ops.add_rmsnorm(hidden, residual, self.final_norm, eps)
        x = x[batch.logits_indices]
        return self.comm.logits(ops.linear(x, self.lm_head, None).float())

    def _fused_layer(
        self,
        layer: LayerWeights,
        residual: torch.Tensor,
        cos_sin: torch.Tensor,
        kv: LayerKV,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """One layer as the fused ops: the residual stream in, the residual stream out."""
        ops, cfg, eps = self.ops, self.config, self.config.rms_norm_eps
        if layer.q_norm is None:
            q = ops.rmsnorm_qkv_rope(
                residual, layer.attn_norm, eps, layer.qkv, layer.qkv_bias, cos_sin, kv, batch.slot_mapping
            )
        else:  # per-head q/k norms sit between the projection and RoPE
            qkv = ops.rmsnorm_linear(residual, layer.attn_norm, eps, layer.qkv, layer.qkv_bias)
            q = self._rope(qkv, layer, cos_sin, kv, batch)
        attn = ops.attention(q, kv, batch.attn, self.scale)
        residual = ops.linear_residual(attn.reshape(batch.num_tokens, cfg.q_size), layer.o_proj, residual)
        if not isinstance(layer.mlp, DenseMLP):  # a sparse block: its router and experts, unfused
            return layer.mlp(ops, ops.rmsnorm(residual, layer.ffn_norm, eps)) + residual
        act = ops.rmsnorm_gate_up_silu(residual, layer.ffn_norm, eps, layer.mlp.gate_up)
        return ops.linear_residual(act, layer.mlp.down, residual)

    def _rope(
        self, qkv: torch.Tensor, layer: LayerWeights, cos_sin: torch.Tensor, kv: LayerKV, batch: ForwardBatch
    ) -> torch.Tensor:
        """The q|k|v projection split into heads, q/k normed (Qwen3), k and v stored, q rotated."""
        ops, cfg, n = self.ops, self.config, batch.num_tokens
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(n, cfg.num_heads, cfg.head_dim)
        k = k.reshape(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(n, cfg.num_kv_heads, cfg.head_dim)
        if layer.q_norm is not None:
            q = ops.rmsnorm(q, layer.q_norm, cfg.rms_norm_eps)
            k = ops.rmsnorm(k, layer.k_norm, cfg.rms_norm_eps)
        return ops.rope_store_kv(q, k, v, cos_sin, kv, batch.slot_mapping)


class _WeightTaker:
    """Pops named tensors, converting them to the compute dtype and device; reports missing names
    and, at the end, names nothing consumed (a sign of a mismatched checkpoint)."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor | QuantWeight | Fp8Weight],
        device: torch.device,
        dtype: torch.dtype,
        fp8: bool = False,
    ) -> None:
        self.weights, self.device, self.dtype, self.fp8 = weights, device, dtype, fp8

    def __call__(self, name: str) -> torch.Tensor:
        return self.dense(self.gemm(name))

    def gemm(self, name: str) -> torch.Tensor | QuantWeight | Fp8Weight:
        """A GEMM weight: packed GGUF blocks stay packed (`ops.prepare_weight` takes them), FP8
        ones stay FP8 in fp8 mode."""
        if name not in self.weights:
            raise ModelFormatError(f"weight {name!r} is missing from the checkpoint")
        w = self.weights.pop(name)
        if isinstance(w, Fp8Weight) and self.fp8:
            return w.to(self.device)
        return w if isinstance(w, QuantWeight) else self.dense(w)

    def layer_gemm(self, name: str) -> torch.Tensor | QuantWeight | Fp8Weight:
        """A decoder layer's projection: quantized to FP8 here in fp8 mode."""
        w = self.gemm(name)
        return Fp8Weight.quantize(w) if self.fp8 and isinstance(w, torch.Tensor) else w

    def dense(self, w: torch.Tensor | QuantWeight | Fp8Weight) -> torch.Tensor:
        if isinstance(w, QuantWeight):
            w = w.dequantize()
        elif isinstance(w, Fp8Weight):
            w = w.to(self.device).dequantize(self.dtype)
        return w.to(device=self.device, dtype=self.dtype)

    def stack(self, parts: list) -> torch.Tensor | QuantWeight | Fp8Weight:
        """Rows of several weights as one (q|k|v, gate|up), packed where all are packed alike."""
        if all(isinstance(p, QuantWeight) for p in parts) and len({p.qtype for p in parts}) == 1:
            return QuantWeight.cat(parts)
        if all(isinstance(p, Fp8Weight) for p in parts):
            return Fp8Weight.cat(parts)
        return torch.cat([self.dense(p) for p in parts]).contiguous()

    def check_all_used(self) -> None:
        rest = [n for n in self.weights if not n.endswith("rotary_emb.inv_freq")]
        if rest:
            raise ModelFormatError(f"checkpoint has {len(rest)} unexpected tensors, e.g. {rest[:3]}")
