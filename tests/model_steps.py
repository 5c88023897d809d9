"""Ragged forward steps of a `LlamaModel` on its own paged pool, for tests that run one model on
several op tables (kernels, reference, float32 oracle) and compare their logits step by step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sgjit.kernels.ops import AttentionMetadata, OpTable
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.model.llama import LlamaModel


def random_model_weights(
    cfg, device: torch.device, seed: int, norm_seed: int, norm_spread: float
) -> dict[str, torch.Tensor]:
    """bf16 random weights of `cfg`'s shape with the norm weights drawn around 1 (+- `norm_spread`),
    since all-ones norms would hide a norm weight applied wrongly."""
    from sgjit.runtime.model.presets import random_weights

    weights = random_weights(cfg, seed=seed, device=device, dtype=torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(norm_seed)
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            weights[name] = (1 + norm_spread * torch.randn(w.shape, device=device, generator=g)).to(w.dtype)
    return weights


class Side:
    """One model + ops table with its own pool and page lists (rows own interleaved pages, so a
    row's tokens are not contiguous in the pool); `step` runs the tokens from `starts` on."""

    def __init__(
        self, model: LlamaModel, ops: OpTable, rows: int, max_tokens: int, page: int = 16,
        kv_dtype: torch.dtype | None = None,
    ) -> None:  # fmt: skip
        cfg, dev = model.config, model.device
        self.model, self.ops, self.page, self.device = model, ops, page, dev
        per_row = -(-max_tokens // page)
        self.pool = PagedKVPool(
            cfg.num_layers, rows * per_row + 1, page, cfg.num_kv_heads, cfg.head_dim, kv_dtype or model.dtype, dev
        )  # fmt: skip
        self.pool.k.zero_()  # NOTE: CPU pools start uninitialised; a NaN in a masked key still
        self.pool.v.zero_()  # poisons torch's SDPA (the mask is added to the scores)
        self.pages = [list(range(1 + r, 1 + rows * per_row, rows)) for r in range(rows)]

    def step(self, seqs: list[list[int]], starts: list[int], all_positions: bool = False) -> torch.Tensor:
        ids, positions, slots, qo, logits_idx = [], [], [], [0], []
        for toks, start, pages in zip(seqs, starts, self.pages):
            for p in range(start, len(toks)):
                ids.append(toks[p])
                positions.append(p)
                slots.append(pages[p // self.page] * self.page + p % self.page)
            logits_idx.extend(range(qo[-1], len(ids)) if all_positions else [len(ids) - 1])
            qo.append(len(ids))
        kv_lens = [len(t) for t in seqs]
        dev = self.device
        meta = AttentionMetadata(
            qo_indptr=torch.tensor(qo, dtype=torch.int32, device=dev),
            kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            page_table=torch.tensor([p[: -(-max(kv_lens) // self.page)] for p in self.pages], dtype=torch.int32, device=dev),
            page_size=self.page, max_q_len=max(qo[i + 1] - qo[i] for i in range(len(seqs))),
            max_kv_len=max(kv_lens), qo_indptr_host=qo, kv_lens_host=kv_lens,
        )  # fmt: skip
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            attn=meta,
            logits_indices=torch.tensor(logits_idx, dtype=torch.int64, device=dev),
        )
        self.model.ops = self.ops
        return self.model.forward(batch, self.pool.layers)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; a NaN in `out` fails (an unwritten or corrupted element)."""
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in the output (an unwritten or corrupted element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@dataclass
class Agreement:
    """Of a teacher-forced decode on three sides: the candidate's and the baseline's logits error
    against the oracle each step, steps x rows where the candidate's argmax differs from the baseline's,
    the oracle's margins there, and how often the baseline misses the oracle's argmax."""

    err_candidate: list[float] = field(default_factory=list)
    err_baseline: list[float] = field(default_factory=list)
    differ: int = 0
    miss_baseline: int = 0
    margins: list[float] = field(default_factory=list)

    def summary(self, candidate: str, baseline: str) -> str:
        n = len(self.err_candidate)
        return (
            f"logits rel err vs fp32 — {candidate} {sum(self.err_candidate) / n:.2e} (max {max(self.err_candidate):.2e}), "
            f"{baseline} {sum(self.err_baseline) / n:.2e} (max {max(self.err_baseline):.2e}); greedy tokens differing "
            f"{self.differ} ({baseline} vs oracle {self.miss_baseline}), oracle margins there {self.margins}"
        )

    def assert_within_noise(self) -> None:
        """The candidate is no noisier than the baseline (1.5x), and flips no more often than two sides
        equally noisy around the oracle would: about twice as often as one misses the oracle's argmax
        (measured on the H200: 20 of 128, all at margins the noise explains), plus three standard
        deviations of that count, plus two."""
        n = len(self.err_candidate)
        assert sum(self.err_candidate) / n <= 1.5 * sum(self.err_baseline) / n + 1e-3
        assert self.differ <= 2 * self.miss_baseline + 3 * (2 * self.miss_baseline) ** 0.5 + 2


def teacher_forced(
    candidate: Side, baseline: Side, oracle: Side, seqs: list[list[int]], steps: int,
    on_step: Callable[[int, list[int]], None] | None = None,
) -> Agreement:  # fmt: skip
    """Decode `steps` tokens a row on three sides, each fed the baseline's greedy token, after the
    prompts in `seqs` were stepped on every side. A step where the candidate's argmax differs from the
    baseline's must be a near tie: the oracle's margin between the two tokens under six times the
    baseline's RMS logit noise. `on_step(step, starts)` runs after each step (extra checks)."""
    got, rows = Agreement(), len(seqs)
    tokens = [0] * rows
    for step in range(steps):
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, tokens):
            s.append(t)
        lc, lb, lo = (side.step(seqs, starts) for side in (candidate, baseline, oracle))
        if on_step is not None:
            on_step(step, starts)
        got.err_candidate.append(rel_err(lc, lo))
        got.err_baseline.append(rel_err(lb, lo))
        noise = (lb - lo).pow(2).mean(-1).sqrt()
        tc, tb = lc.argmax(-1), lb.argmax(-1)
        got.miss_baseline += int((tb != lo.argmax(-1)).sum())
        for b in range(rows):
            if tc[b] != tb[b]:
                got.differ += 1
                margin = abs((lo[b, tc[b]] - lo[b, tb[b]]).item())
                got.margins.append(round(margin, 4))
                assert margin < 6 * noise[b].item(), f"step {step} row {b}: margin {margin:.3f}"
        tokens = tb.tolist()
    return got
