"""The sparse mixture-of-experts feed-forward of Mixtral, Qwen2-MoE and Qwen3-MoE: a router picks
each token's top-k experts, the `moe_experts` op runs them, and Qwen2-MoE adds a shared expert
scaled by a sigmoid gate. The checkpoint's per-expert weights are stacked at load into [E, 2I, H]
(gate|up) and [E, H, I] (down), the layout a grouped GEMM reads in one launch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sgjit.kernels.ops import OpTable, PrepareWeight
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.mlp import DenseMLP, WeightSource


@dataclass(frozen=True, slots=True)
class MoeNames:
    """Where a family keeps a sparse layer's tensors: the router at `<block>.gate.weight` and expert
    e's projections at `<block>.experts.<e>.<gate|up|down>.weight`, under `model.layers.<i>.`."""

    block: str
    gate: str
    up: str
    down: str

    def router(self, layer: int) -> str:
        return f"model.layers.{layer}.{self.block}.gate.weight"

    def expert(self, layer: int, e: int, proj: str) -> str:
        return f"model.layers.{layer}.{self.block}.experts.{e}.{proj}.weight"


_QWEN = MoeNames("mlp", "gate_proj", "up_proj", "down_proj")
MOE_NAMES = {
    "mixtral": MoeNames("block_sparse_moe", "w1", "w3", "w2"),
    "qwen2_moe": _QWEN,
    "qwen3_moe": _QWEN,
}


def shared_prefix(layer: int) -> str:
    """Qwen2-MoE's shared expert (gate_proj / up_proj / down_proj) and, beside it, its gate."""
    return f"model.layers.{layer}.mlp.shared_expert"


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids int64 [N, K], weights float32 [N, K]): the top-k of the router's softmax, taken in
    float32, optionally rescaled to sum to one."""
    weights, ids = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


@dataclass(slots=True)
class SparseMoE:
    router: Any  # [E, hidden] (+ the shared expert's gate row), as ops.prepare_weight left it
    gate_up: torch.Tensor  # [E, 2 I, hidden]
    down: torch.Tensor  # [E, hidden, I]
    top_k: int
    renormalize: bool
    shared: DenseMLP | None = None

    @property
    def num_experts(self) -> int:
        return self.gate_up.shape[0]

    def __call__(self, ops: OpTable, x: torch.Tensor) -> torch.Tensor:
        logits = ops.linear(x, self.router, None)  # the shared expert's gate rides along: one GEMM
        e = self.num_experts
        ids, weights = route(logits[:, :e], self.top_k, self.renormalize)
        out = ops.moe_experts(x, ids, weights, self.gate_up, self.down)
        if self.shared is not None:
            out = out + torch.sigmoid(logits[:, e:]) * self.shared(ops, x)
        return out


FeedForward = DenseMLP | SparseMoE


def load_feed_forward(
    take: WeightSource, config: ModelConfig, layer: int, prepare: PrepareWeight
) -> FeedForward:
    """Layer `layer`'s feed-forward: its MoE block where the config makes the layer sparse, else its
    dense MLP."""
    moe = config.moe
    if moe is None or not moe.is_sparse(layer):
        return DenseMLP.load(take, f"model.layers.{layer}.mlp.", prepare)
    names = MOE_NAMES[config.architecture]
    experts = range(moe.num_experts)
    gate_up = _stacked(
        take, [(names.expert(layer, e, names.gate), names.expert(layer, e, names.up)) for e in experts]
    )
    down = _stacked(take, [(names.expert(layer, e, names.down),) for e in experts])
    router, shared = take(names.router(layer)), None
    if moe.shared_intermediate_size:
        shared = DenseMLP.load(take, shared_prefix(layer) + ".", prepare)
        router = torch.cat([router, take(shared_prefix(layer) + "_gate.weight")])
    return SparseMoE(prepare(router), gate_up, down, moe.top_k, moe.norm_topk_prob, shared)


def _stacked(take: WeightSource, per_expert: list[tuple[str, ...]]) -> torch.Tensor:
    """[E, rows, cols]: expert e's weights (its parts' rows concatenated) copied into one tensor as
    they are taken, so no more than one expert is ever held twice."""
    out: torch.Tensor | None = None
    for e, parts in enumerate(per_expert):
        w = torch.cat([take(n) for n in parts]) if len(parts) > 1 else take(parts[0])
        if out is None:
            out = w.new_empty(len(per_expert), *w.shape)
        out[e] = w
    assert out is not None  # a sparse layer has experts
    return out


def sparse_layer_shapes(config: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a sparse layer's feed-forward by checkpoint name, with its shape."""
    moe, h = config.moe, config.hidden_size
    assert moe is not None
    names, i = MOE_NAMES[config.architecture], moe.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {names.router(layer): (moe.num_experts, h)}
    for e in range(moe.num_experts):
        shapes |= {
            names.expert(layer, e, names.gate): (i, h),
            names.expert(layer, e, names.up): (i, h),
            names.expert(layer, e, names.down): (h, i),
        }
    s = moe.shared_intermediate_size
    if s:
        p = shared_prefix(layer)
        shapes |= {
            f"{p}.gate_proj.weight": (s, h),
            f"{p}.up_proj.weight": (s, h),
            f"{p}.down_proj.weight": (h, s),
            f"{p}_gate.weight": (1, h),
        }
    return shapes
