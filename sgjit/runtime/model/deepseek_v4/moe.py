"""DeepSeek-V4's mixture of experts: a router scores every expert (sqrt(softplus), sigmoid or
softmax of the logits); the first layers pick each token's experts from a fixed token-id table
(hash routing), the others take the top-k of the scores plus a learned bias that only steers the
choice. The chosen experts' scores, renormalised and multiplied by `routed_scaling_factor`, weight
their outputs; a shared expert runs on every token. Every SwiGLU here clips its gate from above
and its up-projection both ways at `swiglu_limit`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from sgjit.kernels.ops import OpTable


def clamped_swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def routed_experts_reference(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """sum over k of weights[n, k] * expert ids[n, k](x[n]): one gate|up and one down GEMM per expert
    that has tokens, added in expert order in float32. The torch reference of the grouped `moe_experts`
    op (branch `moe`, not on main yet) with the clipped SwiGLU added: the op to move to once it takes
    a limit. Reads the per-expert counts on the host (eager only)."""
    n, k = ids.shape
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    rows, w = order // k, weights.reshape(-1)[order].float()
    out = torch.zeros(n, x.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            idx = rows[start : start + count]
            y = F.linear(clamped_swiglu(F.linear(x[idx], gate_up[e]), limit), down[e])
            out.index_add_(0, idx, y.float() * w[start : start + count, None])
        start += count
    return out.to(x.dtype)


_SCORES = {
    "sqrtsoftplus": lambda logits: F.softplus(logits).sqrt(),
    "sigmoid": torch.sigmoid,
    "softmax": lambda logits: torch.softmax(logits, dim=-1),
}


@dataclass(slots=True)
class DeepseekV4MoE:
    router: torch.Tensor  # float32 [E, hidden]
    gate_up: torch.Tensor  # [E, 2 I, hidden]
    down: torch.Tensor  # [E, hidden, I]
    shared_gate_up: Any  # [2 I_shared, hidden], as ops.prepare_weight left it
    shared_down: Any
    top_k: int
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float
    score_bias: torch.Tensor | None = None  # float32 [E]: top-k layers, steers the choice only
    token_experts: torch.Tensor | None = None  # int64 [vocab, top_k]: hash layers, experts by token id

    def route(self, x: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids int64 [N, K], weights float32 [N, K]); the router runs in float32."""
        scores = _SCORES[self.scoring_func](F.linear(x.float(), self.router))
        if self.token_experts is not None:
            ids = self.token_experts[input_ids]
        else:
            ids = torch.topk(scores + self.score_bias, self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * self.routed_scaling_factor

    def __call__(self, ops: OpTable, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x, input_ids)
        routed = routed_experts_reference(x, ids, weights, self.gate_up, self.down, self.swiglu_limit)
        shared = ops.linear(
            clamped_swiglu(ops.linear(x, self.shared_gate_up, None), self.swiglu_limit),
            self.shared_down,
            None,
        )
        return routed + shared
