"""The compressors of CSA and HCA layers (and of the CSA indexer's keys): every `rate` tokens become
one compressed entry, a per-channel softmax over the window's gates (each token's gate plus a
learned bias by its offset in the window) weighting the window's values, then an RMSNorm and RoPE
at the window's first position. A CSA compressor overlaps windows: each token projects two halves,
"a" feeding the next window's entry and "b" its own, so entry w pools the "a" halves of window w - 1
and the "b" halves of window w over 2 * rate slots.

Entries and open windows are computed in chunks that start anywhere: an open window's tokens before
the chunk are folded into one element (their gates' log-sum-exp and the weighted mean of their
values, the state `cache.py` keeps per page), and softmax pooling of that element together with the
rest equals pooling all the tokens. `PoolPlan` says, for one rate in one step, which elements each
finished entry and each saved state pools; it is built once on the host and serves every layer of
that rate."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from sgjit.kernels.ops import OpTable
from sgjit.runtime.model.deepseek_v4.cache import CompressedCache, entry_slots
from sgjit.runtime.model.deepseek_v4.norm import rms_norm
from sgjit.runtime.model.deepseek_v4.rope import Rotary


@dataclass(frozen=True, slots=True)
class RowSpan:
    """One batch row's part of the step: positions [start, end), its first token at `offset` of the
    flat batch, its pages."""

    start: int
    end: int
    offset: int
    pages: list[int]


@dataclass(slots=True)
class PoolPlan:
    """Element ids: 0 = none (gate -inf); then each resuming row's saved open windows; then the step's
    tokens (CSA: token i's "a" half at 2i, "b" half at 2i + 1)."""

    overlap: bool
    positions: torch.Tensor  # int64 [N]: the step's token positions
    init_pages: torch.Tensor  # int64 [rows resuming]: the page whose state each resumes from
    gather: torch.Tensor  # int64 [entries + states * open, L]: the elements each accumulator pools
    entry_slots: torch.Tensor  # int64 [entries]: flat entry slot of each finished entry
    entry_positions: torch.Tensor  # int64 [entries]: the RoPE position of each (its window's start)
    state_pages: torch.Tensor  # int64 [states]: the page each saved state goes to

    @property
    def open_windows(self) -> int:
        return 2 if self.overlap else 1


def build_pool_plan(
    rows: list[RowSpan], positions: torch.Tensor, rate: int, overlap: bool, page_size: int
) -> PoolPlan:
    """Entries that complete in the step, and the open windows after each page's last token written
    this step (a page end, or the row's last token)."""
    device = positions.device
    ps, n_open, slots = page_size, (2 if overlap else 1), entry_slots(rate, page_size)
    resuming = [r for r in rows if r.start > 0]
    token_base = 1 + n_open * len(resuming)
    init_pages = [r.pages[(r.start - 1) // ps] for r in resuming]
    entries: list[list[int]] = []
    states: list[list[int]] = []
    slots_out, entry_pos, state_pages = [], [], []
    next_init = 1
    for r in rows:
        by_entry: dict[int, list[tuple[int, int]]] = defaultdict(list)  # entry -> (position, element)
        if r.start > 0:
            for a in range(n_open):  # the open windows saved after position start - 1
                by_entry[r.start // rate + a].append((r.start - 1, next_init + a))
            next_init += n_open
        for p in range(r.start, r.end):
            i = r.offset + p - r.start
            if overlap:
                by_entry[p // rate + 1].append((p, token_base + 2 * i))
                by_entry[p // rate].append((p, token_base + 2 * i + 1))
            else:
                by_entry[p // rate].append((p, token_base + i))
        for w in range(r.start // rate, r.end // rate):
            entries.append([el for _, el in by_entry[w]])
            slots_out.append(r.pages[((w + 1) * rate - 1) // ps] * slots + w % slots)
            entry_pos.append(w * rate)
        page_ends = range((r.start // ps + 1) * ps - 1, r.end, ps)
        for q in sorted({*page_ends, r.end - 1}):
            first = (q + 1) // rate
            for a in range(n_open):
                states.append([el for pos, el in by_entry.get(first + a, ()) if pos <= q])
            state_pages.append(r.pages[q // ps])
    lists = entries + states
    width = max(1, max(map(len, lists), default=1))
    gather = torch.zeros(len(lists), width, dtype=torch.int64)
    for j, ids in enumerate(lists):
        gather[j, : len(ids)] = torch.tensor(ids, dtype=torch.int64)

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return PoolPlan(
        overlap, positions, t(init_pages), gather.to(device), t(slots_out), t(entry_pos), t(state_pages)
    )


@dataclass(slots=True)
class Compressor:
    """One compressor: kv and gate projections ([open * dim, hidden], as ops.prepare_weight left
    them), the gate bias by offset in the window (float32 [rate, open * dim]), the entries' RMSNorm
    weight (float32 [dim]) and RoPE (the compress one)."""

    kv: Any
    gate: Any
    position_bias: torch.Tensor
    norm: torch.Tensor
    rotary: Rotary
    eps: float

    def __call__(self, ops: OpTable, x: torch.Tensor, plan: PoolPlan, cache: CompressedCache) -> None:
        """Finish this step's entries into `cache.entries` and save the open windows into
        `cache.state`, from the step's attention inputs `x` [N, hidden]."""
        pool(plan, ops.linear(x, self.kv, None), ops.linear(x, self.gate, None), self, cache)


def pool(
    plan: PoolPlan, kv: torch.Tensor, gate: torch.Tensor, weights: Compressor, cache: CompressedCache
) -> None:
    """The softmax pooling of `Compressor.__call__`; `kv` / `gate` [N, open * dim] are the step's
    projections."""
    dim = cache.entries.shape[-1]
    rate = weights.position_bias.shape[0]
    gate = gate.float() + weights.position_bias[plan.positions % rate]
    saved = cache.state[plan.init_pages]  # [resuming, open, 2, dim]
    none = torch.zeros(1, dim, dtype=torch.float32, device=kv.device)
    elem_gate = torch.cat([none - float("inf"), saved[:, :, 0].reshape(-1, dim), gate.reshape(-1, dim)])
    elem_value = torch.cat([none, saved[:, :, 1].reshape(-1, dim), kv.float().reshape(-1, dim)])
    g, v = elem_gate[plan.gather], elem_value[plan.gather]  # [accumulators, L, dim]
    lse = torch.logsumexp(g, dim=1)
    mean = (torch.exp(g - lse.masked_fill(lse == float("-inf"), 0.0)[:, None]) * v).sum(dim=1)
    n = plan.entry_slots.shape[0]
    if n:
        entry = rms_norm(mean[:n].to(kv.dtype), weights.norm, weights.eps)
        rot = weights.rotary
        cache.entries[plan.entry_slots] = rot.apply(entry, rot.cos_sin(plan.entry_positions)).to(
            cache.entries.dtype
        )
    cache.state[plan.state_pages] = torch.stack([lse[n:], mean[n:]], dim=1).unflatten(
        0, (-1, plan.open_windows)
    )
