"""Random inputs of the ops' real layouts, shared by the GPU tests, the kernel benchmark and the
autotuner: a paged KV pool whose rows own shuffled pages, with the tails of their last pages and
the scratch page holding finite garbage and every page no row owns holding NaN (so a kernel that
reads past a row's length or outside its pages shows up), plus the matching metadata; and routed
tokens for the MoE experts op, with the expert loads a real router gives (even, skewed, one expert
taking everything)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.kernels.ops import AttentionMetadata, LayerKV

GARBAGE = 100.0  # in padding slots: large enough that reading one is visible in the output


@dataclass(slots=True)
class AttentionCase:
    q: torch.Tensor  # [N, Hq, D]
    kv: LayerKV
    meta: AttentionMetadata


def _fill(pool: torch.Tensor, value: float) -> None:
    if pool.dtype == torch.float8_e4m3fn:
        pool.view(torch.uint8).fill_(0x7F if value != value else 0)  # e4m3fn NaN is 0x7f
        if value == value:
            pool.copy_(torch.full(pool.shape, value, device=pool.device).to(pool.dtype))
    else:
        pool.fill_(value)


def paged_attention_case(
    q_lens: list[int],
    kv_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    kv_scale: float = 1.0,
    spare_pages: int = 8,
    consecutive_pages: bool = False,
) -> AttentionCase:
    """Rows b = 0.. with q_lens[b] new queries over kv_lens[b] keys (kv_lens[b] >= q_lens[b]), on
    pages in random order, or with `consecutive_pages`, in id order (what a fresh pool hands out)."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_row = [-(-n // page_size) for n in kv_lens]
    num_pages = 1 + sum(pages_per_row) + spare_pages
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k = torch.empty(shape, dtype=kv_dtype, device=device)
    v = torch.empty(shape, dtype=kv_dtype, device=device)
    _fill(k, float("nan"))
    _fill(v, float("nan"))
    # drawn either way, so both page orders hold the same values
    order = torch.randperm(num_pages - 1, generator=g, device=device)[: sum(pages_per_row)] + 1
    if consecutive_pages:
        order = torch.arange(1, 1 + sum(pages_per_row), device=device)
    k_slots, v_slots = k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)
    max_pages = max(pages_per_row)
    table = torch.zeros(len(kv_lens), max_pages, dtype=torch.int32, device=device)
    used = 0
    for b, (n, p) in enumerate(zip(kv_lens, pages_per_row)):
        pages = order[used : used + p]
        used += p
        table[b, :p] = pages.int()
        slots = (pages[:, None] * page_size + torch.arange(page_size, device=device)).flatten()
        for pool in (k_slots, v_slots):
            vals = torch.randn(p * page_size, num_kv_heads, head_dim, generator=g, device=device)
            vals[n:] = GARBAGE
            pool[slots] = (
                (vals / kv_scale).to(kv_dtype) if kv_dtype == torch.float8_e4m3fn else vals.to(kv_dtype)
            )
    _fill(k[0], GARBAGE)
    _fill(v[0], GARBAGE)
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    q = torch.randn(qo[-1], num_heads, head_dim, generator=g, device=device).to(dtype)
    scale = kv_scale if kv_dtype == torch.float8_e4m3fn else 1.0
    meta = AttentionMetadata(
        qo_indptr=torch.tensor(qo, dtype=torch.int32, device=device),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        page_table=table,
        page_size=page_size,
        max_q_len=max(q_lens),
        max_kv_len=max(kv_lens),
        qo_indptr_host=qo,
        kv_lens_host=list(kv_lens),
    )
    return AttentionCase(q, LayerKV(k, v, scale, scale), meta)


@dataclass(slots=True)
class MoeCase:
    x: torch.Tensor  # [N, H]
    topk_ids: torch.Tensor  # int64 [N, K]
    topk_weights: torch.Tensor  # float32 [N, K]
    w_gate_up: torch.Tensor  # [E, 2I, H]
    w_down: torch.Tensor  # [E, H, I]

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        return self.x, self.topk_ids, self.topk_weights, self.w_gate_up, self.w_down


def moe_experts_case(
    n: int, experts: int, k: int, hidden: int, inter: int, dtype: torch.dtype, device: torch.device | str,
    load: str = "uniform", seed: int = 0,
) -> MoeCase:  # fmt: skip
    """`load`: "uniform" (every expert about n*k/E rows), "skewed" (a few experts take most rows and
    expert 1 none), "one" (every token's first choice is expert 0)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device)

    scores = torch.rand(n, experts, generator=g, device=device)
    if load == "skewed":
        scores = scores * torch.linspace(4.0, 0.1, experts, device=device) ** 3
        scores[:, 1] = -1.0
    elif load == "one":
        scores[:, 0] = 2.0
    return MoeCase(
        x=rnd(n, hidden).to(dtype),
        topk_ids=scores.topk(k, dim=-1).indices,
        topk_weights=torch.rand(n, k, generator=g, device=device).softmax(-1),
        w_gate_up=(rnd(experts, 2 * inter, hidden) / hidden**0.5).to(dtype),
        w_down=(rnd(experts, hidden, inter) / inter**0.5).to(dtype),
    )
