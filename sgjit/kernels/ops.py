"""The ops table: every op the model calls, with one signature that the torch reference
(`reference.py`) and the CUDA kernels share. The model never calls torch math directly for these, so
a kernel replaces its reference op without the model changing.

Shapes use N = tokens in the step (ragged rows flattened), B = rows, Hq/Hkv = heads, D = head dim.
The KV pool is paged: a layer's K and V are `[num_pages, page_size, Hkv, D]`; a token's slot is
`page * page_size + offset`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch


@dataclass(slots=True)
class LayerKV:
    """One layer's paged K/V storage. For an fp8 pool, stored = value / scale."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


@dataclass(slots=True)
class AttentionMetadata:
    """Where each row's queries sit in the flat batch and where its keys sit in the pool.

    Row b owns queries `qo_indptr[b]:qo_indptr[b+1]` and attends causally over its first
    `kv_lens[b]` cached tokens, which include this step's; query i of the row is at absolute
    position `kv_lens[b] - q_len_b + i`."""

    qo_indptr: torch.Tensor  # int32 [B+1]
    kv_lens: torch.Tensor  # int32 [B]
    page_table: torch.Tensor  # int32 [B, max_pages]
    page_size: int
    max_q_len: int
    max_kv_len: int
    qo_indptr_host: list[int]
    kv_lens_host: list[int]

    @property
    def num_rows(self) -> int:
        return self.kv_lens.shape[0]  # not the host list: CUDA graphs leave that empty

    @property
    def is_decode(self) -> bool:
        return self.max_q_len == 1


@dataclass(slots=True)
class SamplingTensors:
    """Per-row sampling parameters for one step, on the logits' device. temperature 0 = greedy;
    top_k <= 0 = off; seeds < 0 = not seeded (draw from the sampler's generator, or use `draw`)."""

    temperature: torch.Tensor  # float32 [B]
    top_p: torch.Tensor  # float32 [B]
    top_k: torch.Tensor  # int32 [B]
    min_p: torch.Tensor  # float32 [B]
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B] (token index within the request, the Philox offset)
    all_greedy: bool
    seeds_host: list[int]
    steps_host: list[int]
    # int64 [1] on the device: the Philox key of unseeded rows, drawn ahead of time so a CUDA graph
    # can replay the sampling without the host; None = the op draws one from its generator.
    draw: torch.Tensor | None = None


RMSNorm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
# (x, residual, weight, eps) -> (normed, x + residual)
AddRMSNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
# (q [N,Hq,D], k [N,Hkv,D], v [N,Hkv,D], positions [N], cos_sin [P, R], kv, slot_mapping [N]) -> rotated q
RopeStoreKV = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LayerKV, torch.Tensor],
    torch.Tensor,
]
# (q [N,Hq,D], kv, meta, softmax scale) -> out [N,Hq,D]
Attention = Callable[[torch.Tensor, LayerKV, AttentionMetadata, float], torch.Tensor]
SiluMul = Callable[[torch.Tensor], torch.Tensor]
# (x, weight as prepare_weight returned it, bias) -> x @ weight.T + bias
Linear = Callable[[torch.Tensor, Any, "torch.Tensor | None"], torch.Tensor]
# The decode step's fused ops, each the sequence of unfused ops it replaces (reference.Composition):
# (x, norm weight, eps, weight, bias) -> linear(rmsnorm(x), weight, bias)
RMSNormLinear = Callable[[torch.Tensor, torch.Tensor, float, Any, "torch.Tensor | None"], torch.Tensor]
# (x, norm weight, eps, qkv weight, qkv bias, cos_sin [N, R], kv, slot_mapping [N]) -> rotated q [N, Hq, D]:
# rope_store_kv on the q|k|v split of rmsnorm_linear (head counts from the pool and the weight)
RMSNormQKVRope = Callable[
    [torch.Tensor, torch.Tensor, float, Any, "torch.Tensor | None", torch.Tensor, LayerKV, torch.Tensor],
    torch.Tensor,
]
# (x, norm weight, eps, gate|up weight) -> silu_mul(rmsnorm_linear(...))
RMSNormGateUpSilu = Callable[[torch.Tensor, torch.Tensor, float, Any], torch.Tensor]
# (x, weight, residual) -> residual + linear(x, weight)
LinearResidual = Callable[[torch.Tensor, Any, torch.Tensor], torch.Tensor]
# weight [out, in] -> the form `linear` wants (identity for torch; a packed layout for oneDNN)
PrepareWeight = Callable[[torch.Tensor], Any]
# (x [N,H], topk_ids int64 [N,K], topk_weights float32 [N,K], w_gate_up [E,2I,H], w_down [E,H,I]) -> [N,H]:
# row n = sum over k of topk_weights[n,k] * down_e(silu(gate_e(x_n)) * up_e(x_n)), e = topk_ids[n,k]
MoeExperts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class DecodeLayerWeights:
    """One dense decoder layer's tensors as the decode megakernel streams them."""

    attn_norm: torch.Tensor
    qkv: Any  # [q_size + 2 kv_size, hidden]
    qkv_bias: torch.Tensor | None
    o_proj: Any
    ffn_norm: torch.Tensor
    gate_up: Any  # [2 intermediate, hidden]
    down: Any


@dataclass(slots=True)
class DecodeWeights:
    """A dense model's whole decode step as one op takes it: built once by the model, so the op can
    keep the device table of its pointers for as long as the model lives."""

    embed: torch.Tensor  # [vocab, hidden]
    layers: list[DecodeLayerWeights]
    final_norm: torch.Tensor
    lm_head: Any  # [vocab, hidden]
    rope: torch.Tensor  # float32 [max_positions, R]: cos (first half) and sin per position
    eps: float
    scale: float  # the attention softmax scale


# (weights, input_ids [N], positions [N], slot_mapping [N], kv per layer, meta) -> float32 logits [N, V]
# of a decode step (one token a row) as the layered fused ops compute them, or None where the op does
# not serve the step (the model then runs its layers)
DecodeMegakernel = Callable[
    [DecodeWeights, torch.Tensor, torch.Tensor, torch.Tensor, list[LayerKV], AttentionMetadata],
    "torch.Tensor | None",
]


@dataclass(slots=True)
class DecodeAhead:
    """The per-row state a multi-step decode graph moves on from step to step (its first B rows),
    as views of the graph's static buffers."""

    input_ids: torch.Tensor  # int64 [B]: the next step's input token
    positions: torch.Tensor  # int64 [B]: its position
    slots: torch.Tensor  # int64 [B]: the KV slot it writes
    kv_lens: torch.Tensor  # int32 [B]: keys the next step attends over (its own included)
    page_table: torch.Tensor  # int32 [B, W]: each row's pages
    budgets: torch.Tensor  # int64 [B]: steps the row takes in this launch
    stop_on_eos: torch.Tensor  # int64 [B]: nonzero where the row ends at an EOS token
    done: torch.Tensor  # bool [B]: the row has ended (its later steps write the scratch slot)
    eos: torch.Tensor  # int64 [n]: the EOS token ids
    page_size: int
    scratch_slot: int


# (state, tokens int64 [B] drawn at step k, k, out int64 [B]) -> None: out = tokens; a row is done
# once a token of it is an EOS it stops at or step k + 1 reaches its budget; the next step's input is
# the token, at the next position (kv_lens + 1), written to that position's slot in the row's pages
# (the scratch slot once done)
AdvanceDecode = Callable[[DecodeAhead, torch.Tensor, int, torch.Tensor], None]
# (logits [B,V] float32, bitmask int32 [B, ceil(V/32)]) -> None; bit v of row b clear => logits[b, v] = -inf
ApplyBitmask = Callable[[torch.Tensor, torch.Tensor], None]
# (logits [B,V] float32, params, generator) -> token ids int64 [B]
Sample = Callable[[torch.Tensor, SamplingTensors, "torch.Generator | None"], torch.Tensor]


@dataclass(slots=True)
class OpTable:
    rmsnorm: RMSNorm
    add_rmsnorm: AddRMSNorm
    rope_store_kv: RopeStoreKV
    attention: Attention
    silu_mul: SiluMul
    linear: Linear
    prepare_weight: PrepareWeight
    moe_experts: MoeExperts
    apply_bitmask: ApplyBitmask
    sample: Sample
    advance_decode: AdvanceDecode
    rmsnorm_linear: RMSNormLinear
    rmsnorm_qkv_rope: RMSNormQKVRope
    rmsnorm_gate_up_silu: RMSNormGateUpSilu
    linear_residual: LinearResidual
    # Steps of at most this many tokens run a layer as the fused ops (rmsnorm_qkv_rope, attention,
    # linear_residual, rmsnorm_gate_up_silu, linear_residual) and the logits as rmsnorm_linear;
    # larger ones as the unfused ops. 0 (the reference and CPU tables): never.
    fused_rows: int = 0
    # The whole decode step in one launch where the selector offers it (small models, few rows);
    # None (the reference and CPU tables): every step runs layer by layer.
    decode_megakernel: DecodeMegakernel | None = None

    def with_overrides(self, **ops: Any) -> OpTable:
        unknown = set(ops) - {f.name for f in fields(self)}
        if unknown:
            raise KeyError(f"unknown ops {sorted(unknown)}")
        return replace(self, **ops)

    @classmethod
    def names(cls) -> list[str]:
        """The ops (every field but `fused_rows`)."""
        return [f.name for f in fields(cls) if f.name != "fused_rows"]
