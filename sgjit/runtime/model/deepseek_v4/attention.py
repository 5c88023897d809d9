"""DeepSeek-V4 attention over the paged cache (torch reference): every query attends to the shared
K=V of the last `sliding_window` tokens and, in CSA/HCA layers, to compressed entries (HCA: every
finished entry; CSA: the top-k the lightning indexer picks among the finished ones), under one
softmax that also holds a learned per-head sink logit. An entry is finished for a query at position
p once its window ends at or before p.

`StepPlan` is built once a step on the host: the step's rows grouped for attention (rows decoding
one token together, padded; a row reading several tokens alone), with the cache slots each group
reads, and a `PoolPlan` per compressed layer type (CSA, HCA) for the compressors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sgjit.kernels.ops import AttentionMetadata
from sgjit.runtime.model.deepseek_v4.cache import entry_slots
from sgjit.runtime.model.deepseek_v4.compressor import PoolPlan, RowSpan, build_pool_plan
from sgjit.runtime.model.deepseek_v4.config import CSA, HCA, DeepseekV4Config

_NEVER = -(1 << 40)  # the position of a padding key: outside every window
_UNFINISHED = 1 << 40  # the index of a padding entry: never finished


@dataclass(slots=True)
class AttentionGroup:
    q_index: torch.Tensor  # int64 [B, T]: flat token of each query (padding repeats the row's last)
    q_valid: torch.Tensor  # bool [B, T]
    q_pos: torch.Tensor  # int64 [B, T]
    kv_slots: torch.Tensor  # int64 [B, S]: flat slots of the keys in the sliding window (padding: 0)
    kv_pos: torch.Tensor  # int64 [B, S]: their positions (padding: _NEVER)
    entries: dict[int, tuple[torch.Tensor, torch.Tensor]]  # rate -> flat slots [B, E], entry index [B, E]


@dataclass(slots=True)
class StepPlan:
    groups: list[AttentionGroup]
    pools: dict[str, PoolPlan]  # by layer type (CSA, HCA)


def build_step_plan(
    meta: AttentionMetadata, positions: torch.Tensor, config: DeepseekV4Config, page_size: int
) -> StepPlan:
    device, page_table = positions.device, meta.page_table.tolist()
    rows = []
    for b in range(len(meta.kv_lens_host)):
        lo, hi = meta.qo_indptr_host[b], meta.qo_indptr_host[b + 1]
        end = meta.kv_lens_host[b]
        rows.append(RowSpan(end - (hi - lo), end, lo, page_table[b]))
    kinds = {kind: config.csa_rate if kind == CSA else config.hca_rate for kind in (CSA, HCA)}
    kinds = {kind: rate for kind, rate in kinds.items() if kind in config.layer_types}
    pools = {
        kind: build_pool_plan(rows, positions, rate, kind == CSA, page_size) for kind, rate in kinds.items()
    }
    decoding = [r for r in rows if r.end - r.start == 1]
    groups = [[r] for r in rows if r.end - r.start > 1] + ([decoding] if decoding else [])
    return StepPlan(
        [_group(g, config.sliding_window, sorted(set(kinds.values())), page_size, device) for g in groups],
        pools,
    )


def _group(
    rows: list[RowSpan], window: int, rates: list[int], ps: int, device: torch.device
) -> AttentionGroup:
    t = max(r.end - r.start for r in rows)
    q_index = [[r.offset + min(i, r.end - r.start - 1) for i in range(t)] for r in rows]
    q_valid = [[i < r.end - r.start for i in range(t)] for r in rows]
    q_pos = [[r.start + i for i in range(t)] for r in rows]
    keys = [range(max(0, r.start - window + 1), r.end) for r in rows]
    s = max(map(len, keys))
    kv_slots = [[r.pages[p // ps] * ps + p % ps for p in k] + [0] * (s - len(k)) for r, k in zip(rows, keys)]
    kv_pos = [list(k) + [_NEVER] * (s - len(k)) for k in keys]
    entries = {}
    for m in rates:
        slots, counts = entry_slots(m, ps), [r.end // m for r in rows]
        e = max(1, max(counts))
        entries[m] = (
            torch.tensor(
                [[r.pages[((w + 1) * m - 1) // ps] * slots + w % slots for w in range(n)] + [0] * (e - n)
                 for r, n in zip(rows, counts)], dtype=torch.int64, device=device,
            ),
            torch.tensor([list(range(n)) + [_UNFINISHED] * (e - n) for n in counts], dtype=torch.int64, device=device),
        )  # fmt: skip

    def tensor(x: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=device)

    return AttentionGroup(
        tensor(q_index), tensor(q_valid, torch.bool), tensor(q_pos), tensor(kv_slots), tensor(kv_pos), entries
    )


def finished(group: AttentionGroup, rate: int) -> torch.Tensor:
    """bool [B, T, E]: which compressed entries each query may see (their windows have ended)."""
    index = group.entries[rate][1]
    return index[:, None, :] < ((group.q_pos + 1) // rate)[:, :, None]


def indexer_pick(
    q: torch.Tensor, head_weights: torch.Tensor, keys: torch.Tensor, seen: torch.Tensor, top_k: int
) -> torch.Tensor:
    """The lightning indexer's choice, bool [B, T, E]: per query the `top_k` finished entries with the
    largest sum over heads h of weight_h * relu(q_h . key) (q [B, T, Hi, Di], head_weights [B, T, Hi]
    already scaled, keys [B, E, Di], seen: the finished entries)."""
    scores = torch.einsum("bthd,bed->bthe", q.float(), keys.float()).relu() * q.shape[-1] ** -0.5
    scores = (scores * head_weights.float()[..., None]).sum(dim=2).masked_fill(~seen, float("-inf"))
    top = scores.topk(min(top_k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(seen).scatter_(-1, top, True) & seen


def attend(
    q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, sinks: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of q [B, T, H, D] over shared K=V `keys` [B, K, D] where `visible` [B, T, K],
    with each head's sink logit in the softmax (it takes weight, adds no value); float32 inside."""
    keys = keys.float()
    logits = torch.einsum("bthd,bkd->bhtk", q.float(), keys) * scale
    logits = logits.masked_fill(~visible[:, None], float("-inf"))
    sink = sinks.float()[None, :, None, None].expand(*logits.shape[:-1], 1)
    probs = F.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhtk,bkd->bthd", probs, keys).to(q.dtype)
