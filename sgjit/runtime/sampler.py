"""Batched sampling for one step: penalties, min-token and grammar masks on the logits, then the ops
table's `sample` (greedy / temperature / top-k / top-p / min-p, per-row seeds). Also the logprobs
SGLang returns."""

from __future__ import annotations

import torch

from sgjit.kernels.ops import OpTable, SamplingTensors
from sgjit.runtime.request import LogprobEntry, Request


class Sampler:
    def __init__(self, ops: OpTable, device: torch.device, vocab_size: int, seed: int | None = None) -> None:
        self.ops = ops
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed if seed is not None else torch.seed() & 0x7FFF_FFFF)

    def process_logits(
        self, logits: torch.Tensor, reqs: list[Request], eos_ids: tuple[int, ...]
    ) -> torch.Tensor:
        """Penalties, the min_new_tokens block on stop tokens, and grammar masks, in place on this
        step's logits (a fresh tensor every step)."""
        logits = logits[:, : self.vocab_size]
        for i, req in enumerate(reqs):
            p = req.params
            if p.has_penalties and req.num_output > 0:
                self._penalize(logits[i], req)
            if req.num_output < p.min_new_tokens:
                block = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_ids))
                if block:
                    logits[i, block] = float("-inf")
        constrained = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if constrained:
            mask = torch.empty(len(constrained), reqs[constrained[0]].grammar.words, dtype=torch.int32)
            for j, i in enumerate(constrained):
                reqs[i].grammar.fill_bitmask(mask[j])
            idx = torch.tensor(constrained, device=logits.device)
            rows = logits[idx]
            self.ops.apply_bitmask(rows, mask.to(logits.device, non_blocking=True))
            logits[idx] = rows
        return logits

    def _penalize(self, row: torch.Tensor, req: Request) -> None:
        p = req.params
        out = torch.tensor(req.output_ids, dtype=torch.int64, device=row.device)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(req.tokens, dtype=torch.int64, device=row.device).unique()
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def sampling_tensors(self, reqs: list[Request]) -> SamplingTensors:
        dev = self.device
        seeds = [r.params.seed if r.params.seed is not None else -1 for r in reqs]
        steps = [r.num_output for r in reqs]
        return SamplingTensors(
            temperature=torch.tensor(
                [r.params.temperature if not r.params.is_greedy else 0.0 for r in reqs],
                dtype=torch.float32,
                device=dev,
            ),
            top_p=torch.tensor([r.params.top_p for r in reqs], dtype=torch.float32, device=dev),
            top_k=torch.tensor([r.params.top_k for r in reqs], dtype=torch.int32, device=dev),
            min_p=torch.tensor([r.params.min_p for r in reqs], dtype=torch.float32, device=dev),
            seeds=torch.tensor(seeds, dtype=torch.int64, device=dev),
            steps=torch.tensor(steps, dtype=torch.int64, device=dev),
            all_greedy=all(r.params.is_greedy for r in reqs),
            seeds_host=seeds,
            steps_host=steps,
        )

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return self.ops.sample(logits, self.sampling_tensors(reqs), self.generator).tolist()


def logprob_entries(
    logprobs: torch.Tensor, token_ids: list[int], top_n: int, text: callable | None
) -> tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]:
    """(logprob, id, text) of each chosen token and, when asked, of the `top_n` best at each row."""
    ids = torch.tensor(token_ids, dtype=torch.int64, device=logprobs.device)
    chosen = logprobs.gather(1, ids[:, None])[:, 0].tolist()
    entries = [(lp, t, text(t) if text else None) for lp, t in zip(chosen, token_ids)]
    if top_n <= 0:
        return entries, None
    vals, idx = logprobs.topk(top_n, dim=-1)
    tops = [
        [(v, i, text(i) if text else None) for v, i in zip(vrow, irow)]
        for vrow, irow in zip(vals.tolist(), idx.tolist())
    ]
    return entries, tops
