"""The torch implementation of every op in the ops table: the CPU path, the GPU fallback, and the
oracle that every kernel test compares against. Written for clarity first; the CPU decode path is
vectorised over rows because it is also what serves on CPU."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from sgjit.kernels import fp8
from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.ops import (
    AttentionMetadata,
    DecodeAhead,
    LayerKV,
    Linear,
    OpTable,
    RMSNorm,
    RopeStoreKV,
    SamplingTensors,
    SiluMul,
)
from sgjit.kernels.quant import QuantWeight


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's order of operations: normalise in fp32, round to the input dtype, scale."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return weight * normed.to(x.dtype)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rmsnorm(summed, weight, eps), summed


def apply_rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX) RoPE on the first R dims of each head of `x` [N, H, D]; `cos_sin` [N, R] holds
    each token's cos (first half) and sin (second half)."""
    rot = cos_sin.shape[1]
    half = rot // 2
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:rot]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rot < x.shape[-1]:
        parts.append(xf[..., rot:])
    return torch.cat(parts, dim=-1).to(x.dtype)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv: LayerKV, slot_mapping: torch.Tensor) -> None:
    k_slots = kv.k.view(-1, *kv.k.shape[2:])
    v_slots = kv.v.view(-1, *kv.v.shape[2:])
    if kv.k.dtype == torch.float8_e4m3fn:
        # saturate like the kernels (cvt .satfinite): torch's cast turns |x| > 448 into NaN, and a
        # key a little past its calibrated scale would poison the row
        fp8_max = torch.finfo(torch.float8_e4m3fn).max
        k = (k.float() / kv.k_scale).clamp(-fp8_max, fp8_max)
        v = (v.float() / kv.v_scale).clamp(-fp8_max, fp8_max)
    k_slots[slot_mapping] = k.to(kv.k.dtype)
    v_slots[slot_mapping] = v.to(kv.v.dtype)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin: torch.Tensor,
    kv: LayerKV,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    store_kv(apply_rope(k, cos_sin), v, kv, slot_mapping)
    return apply_rope(q, cos_sin)


def _dequant(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    if x.dtype == torch.float8_e4m3fn:
        return x.to(dtype) * scale
    return x.to(dtype)


def gather_kv(
    kv: LayerKV, pages: torch.Tensor, length: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one or more rows as `[..., Hkv, T, D]` from their page lists (`pages` [..., P])."""
    ps = kv.k.shape[1]
    # [..., P, ps, Hkv, D] -> [..., P*ps, Hkv, D] -> [..., Hkv, T, D]
    k, v = kv.k[pages], kv.v[pages]
    k = k.reshape(*pages.shape[:-1], pages.shape[-1] * ps, *kv.k.shape[2:])[..., :length, :, :]
    v = v.reshape(*pages.shape[:-1], pages.shape[-1] * ps, *kv.v.shape[2:])[..., :length, :, :]
    return (
        _dequant(k, kv.k_scale, dtype).transpose(-3, -2),
        _dequant(v, kv.v_scale, dtype).transpose(-3, -2),
    )


def attention(q: torch.Tensor, kv: LayerKV, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of ragged query rows over their paged KV (which includes this step's keys)."""
    ps = meta.page_size
    if meta.is_decode:
        # One query a row: pad every row to the longest context and mask.
        num_pages = -(-meta.max_kv_len // ps)
        k, v = gather_kv(kv, meta.page_table[:, :num_pages], meta.max_kv_len, q.dtype)
        key_pos = torch.arange(meta.max_kv_len, device=q.device)
        mask = (key_pos[None, :] < meta.kv_lens[:, None].to(key_pos.dtype))[:, None, None, :]
        # Padding slots may hold anything, NaN and inf included (the CPU pool is not zeroed): a NaN
        # or inf key there makes the masked score NaN (NaN + -inf), so K is cleared as well as V.
        pad = ~mask[:, :, 0, :, None]
        k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )
        return out[:, :, 0, :]
    out = torch.empty_like(q)
    for b in range(meta.num_rows):
        start, end = meta.qo_indptr_host[b], meta.qo_indptr_host[b + 1]
        q_len, kv_len = end - start, meta.kv_lens_host[b]
        if q_len == 0:
            continue
        k, v = gather_kv(kv, meta.page_table[b, : -(-kv_len // ps)], kv_len, q.dtype)
        qb = q[start:end].transpose(0, 1)  # [Hq, L, D]
        if q_len == kv_len:
            ob = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
            mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None]
            ob = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = ob.transpose(0, 1)
    return out


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def linear(
    x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    if isinstance(weight, Fp8Weight):  # cuBLASLt's FP8 GEMM where the GPU has one, else fp32 math
        return (
            fp8.linear_scaled_mm(x, weight, bias)
            if fp8.fp8_matmul_fits(x, weight)
            else fp8.linear_reference(x, weight, bias)
        )
    return F.linear(x, weight, bias)


def prepare_weight(weight: torch.Tensor | QuantWeight) -> torch.Tensor:
    return weight.dequantize() if isinstance(weight, QuantWeight) else weight  # fp32 on the CPU


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Routed experts: the (token, choice) pairs sorted by expert, one gate|up and one down GEMM per
    expert that has tokens, each result weighted and added into its token's row in float32, in
    expert order (Hugging Face's order, so float32 results agree with it to the GEMMs' rounding).
    Reads the per-expert counts on the host: eager only, a CUDA graph cannot capture it."""
    n, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    rows, weights = order // k, topk_weights.reshape(-1)[order].float()
    out = torch.zeros(n, x.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            idx = rows[start : start + count]
            y = F.linear(silu_mul(F.linear(x[idx], w_gate_up[e])), w_down[e])
            out.index_add_(0, idx, y.float() * weights[start : start + count, None])
        start += count
    return out.to(x.dtype)


class Composition:
    """The fused decode ops computed as the unfused ops they replace, on the given ops: with the torch
    ops below it is the reference of each fused op (what the CPU, the reference path and every
    fused-kernel test compare with); with the CUDA kernels it is what a fused kernel falls back to
    for a step it does not serve."""

    def __init__(
        self, rmsnorm: RMSNorm, linear: Linear, rope_store_kv: RopeStoreKV, silu_mul: SiluMul
    ) -> None:
        self.rmsnorm, self.linear, self.rope_store_kv, self.silu_mul = (
            rmsnorm,
            linear,
            rope_store_kv,
            silu_mul,
        )

    def rmsnorm_linear(
        self,
        x: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        weight: Any,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.linear(self.rmsnorm(x, norm_weight, eps), weight, bias)

    def rmsnorm_qkv_rope(
        self, x: torch.Tensor, norm_weight: torch.Tensor, eps: float, qkv_weight: Any, qkv_bias: torch.Tensor | None,
        cos_sin: torch.Tensor, kv: LayerKV, slot_mapping: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        qkv = self.rmsnorm_linear(x, norm_weight, eps, qkv_weight, qkv_bias)
        n, (hkv, d) = qkv.shape[0], kv.k.shape[2:]
        q, k, v = qkv.split([qkv.shape[1] - 2 * hkv * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.reshape(n, -1, d), k.reshape(n, hkv, d), v.reshape(n, hkv, d)
        return self.rope_store_kv(q, k, v, cos_sin, kv, slot_mapping)

    def rmsnorm_gate_up_silu(
        self, x: torch.Tensor, norm_weight: torch.Tensor, eps: float, gate_up_weight: Any
    ) -> torch.Tensor:
        return self.silu_mul(self.rmsnorm_linear(x, norm_weight, eps, gate_up_weight, None))

    def linear_residual(self, x: torch.Tensor, weight: Any, residual: torch.Tensor) -> torch.Tensor:
        return self.linear(x, weight, None) + residual


_COMPOSED = Composition(rmsnorm, linear, rope_store_kv, silu_mul)
rmsnorm_linear = _COMPOSED.rmsnorm_linear
rmsnorm_qkv_rope = _COMPOSED.rmsnorm_qkv_rope
rmsnorm_gate_up_silu = _COMPOSED.rmsnorm_gate_up_silu
linear_residual = _COMPOSED.linear_residual


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().flatten(1)[:, : logits.shape[1]]
    logits[:, : allowed.shape[1]].masked_fill_(~allowed, float("-inf"))
    logits[:, allowed.shape[1] :] = float("-inf")


def filter_probs(probs: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Zero the probabilities that top-k, top-p and min-p exclude (rows are not renormalised)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    top_k = torch.where(st.top_k > 0, st.top_k, probs.shape[-1]).to(rank.dtype)
    drop = rank >= top_k[:, None]
    cum_before = sorted_p.cumsum(-1) - sorted_p
    drop |= cum_before > st.top_p[:, None]
    drop |= sorted_p < (st.min_p[:, None] * sorted_p[:, :1])
    drop[:, 0] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def _row_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def sample(
    logits: torch.Tensor, st: SamplingTensors, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-row sampling by the exponential race (argmax of p / Exp(1)), so a seeded row draws the same
    noise whatever else is in the batch."""
    greedy = logits.argmax(dim=-1)
    if st.all_greedy:
        return greedy
    temp = st.temperature.clamp_min(1e-6)[:, None]
    probs = filter_probs(torch.softmax(logits / temp, dim=-1), st)
    noise = torch.empty_like(probs)
    for row, (seed, step) in enumerate(zip(st.seeds_host, st.steps_host)):
        g = _row_generator(seed, step, logits.device) if seed >= 0 else generator
        noise[row].exponential_(generator=g)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(st.temperature <= 0, greedy, sampled)


def advance_decode(st: DecodeAhead, tokens: torch.Tensor, step: int, out: torch.Tensor) -> None:
    out.copy_(tokens)
    at_eos = (tokens[:, None] == st.eos[None, :]).any(dim=-1) & (st.stop_on_eos != 0)
    st.done.copy_(st.done | at_eos | (st.budgets <= step + 1))
    st.input_ids.copy_(tokens)
    st.positions.add_(1)
    st.kv_lens.add_(1)
    ps = st.page_size
    col = (st.positions // ps).clamp_max(st.page_table.shape[1] - 1)
    page = st.page_table.gather(1, col[:, None])[:, 0].to(torch.int64)
    st.slots.copy_(torch.where(st.done, st.scratch_slot, page * ps + st.positions % ps))


REFERENCE_OPS = OpTable(
    rmsnorm=rmsnorm, add_rmsnorm=add_rmsnorm, rope_store_kv=rope_store_kv, attention=attention, silu_mul=silu_mul,
    linear=linear, prepare_weight=prepare_weight, moe_experts=moe_experts, apply_bitmask=apply_bitmask,
    sample=sample, advance_decode=advance_decode, rmsnorm_linear=rmsnorm_linear, rmsnorm_qkv_rope=rmsnorm_qkv_rope,
    rmsnorm_gate_up_silu=rmsnorm_gate_up_silu, linear_residual=linear_residual,
)  # fmt: skip
