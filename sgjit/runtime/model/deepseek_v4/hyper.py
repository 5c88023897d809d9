"""Manifold-constrained hyper-connections (mHC): the residual stream is `hc_mult` parallel streams.
Before a block, a learned projection of all streams gives three mixes: `pre` collapses the streams
into the block's input, `post` spreads the block's output back over them, and `comb` mixes the old
streams into the new ones, projected by Sinkhorn-Knopp iterations onto doubly-stochastic matrices
so that deep stacks cannot blow the residual up. The mixes are computed in float32, as transformers
and DeepSeek's reference do; the streams keep the compute dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgjit.runtime.model.deepseek_v4.norm import unit_rmsnorm


@dataclass(slots=True)
class HyperConnection:
    """One block's mHC weights: `fn` [(2 + n) n, n hidden], `base` [(2 + n) n], `scale` [3] (pre,
    post, comb), all float32."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor

    def mixes(
        self, streams: torch.Tensor, sinkhorn_iters: int, hc_eps: float, norm_eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block input [N, hidden], post [N, n], comb [N, n, n]) for `streams` [N, n, hidden]."""
        n = streams.shape[1]
        flat = unit_rmsnorm(streams.flatten(1).float(), norm_eps)
        pre_w, post_w, comb_w = F.linear(flat, self.fn).split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre = torch.sigmoid(pre_w * self.scale[0] + pre_b) + hc_eps
        post = 2 * torch.sigmoid(post_w * self.scale[1] + post_b)
        comb = (
            torch.softmax(comb_w.unflatten(-1, (n, n)) * self.scale[2] + comb_b.view(n, n), dim=-1) + hc_eps
        )
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
        for _ in range(sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return collapsed, post, comb


def expand(
    block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """New streams: the block's output spread by `post`, plus the old streams mixed by `comb`
    (new stream k takes sum_j comb[j, k] * old stream j)."""
    dtype = streams.dtype
    spread = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2)
    return spread + torch.matmul(comb.to(dtype).transpose(-1, -2), streams)


@dataclass(slots=True)
class HyperHead:
    """The last collapse of the streams into one hidden state, before the final norm: `fn` [n, n
    hidden], `base` [n], `scale` [1], float32."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor

    def __call__(self, streams: torch.Tensor, hc_eps: float, norm_eps: float) -> torch.Tensor:
        flat = unit_rmsnorm(streams.flatten(1).float(), norm_eps)
        pre = torch.sigmoid(F.linear(flat, self.fn) * self.scale + self.base) + hc_eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
