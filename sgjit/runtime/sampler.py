"""Batched sampling for one step: penalties, min-token and grammar masks on the logits, then the ops
table's `sample` (greedy / temperature / top-k / top-p / min-p, per-row seeds)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.kernels.ops import OpTable, SamplingTensors
from sgjit.runtime.request import Request


@dataclass(slots=True)
class RowSampling:
    """Each row's sampling parameters on the host, a list entry a row (temperature 0 = greedy). The
    step sampler copies them to the device as `SamplingTensors`; multi-step graphs load them into
    their static buffers."""

    temperature: list[float]
    top_p: list[float]
    top_k: list[int]
    min_p: list[float]
    seeds: list[int]  # -1 = not seeded
    steps: list[int]  # tokens the request has generated: the Philox counter of seeded rows

    @classmethod
    def of(cls, reqs: list[Request]) -> RowSampling:
        ps = [r.params for r in reqs]
        return cls(
            temperature=[0.0 if p.is_greedy else p.temperature for p in ps],
            top_p=[p.top_p for p in ps],
            top_k=[p.top_k for p in ps],
            min_p=[p.min_p for p in ps],
            seeds=[p.seed if p.seed is not None else -1 for p in ps],
            steps=[r.num_output for r in reqs],
        )

    @property
    def all_greedy(self) -> bool:
        return all(t <= 0.0 for t in self.temperature)

    def to_device(self, device: torch.device) -> SamplingTensors:
        def f32(xs: list[float]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.float32, device=device)

        return SamplingTensors(
            temperature=f32(self.temperature),
            top_p=f32(self.top_p),
            top_k=torch.tensor(self.top_k, dtype=torch.int32, device=device),
            min_p=f32(self.min_p),
            seeds=torch.tensor(self.seeds, dtype=torch.int64, device=device),
            steps=torch.tensor(self.steps, dtype=torch.int64, device=device),
            all_greedy=self.all_greedy,
            seeds_host=self.seeds,
            steps_host=self.steps,
        )


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
        """Penalties, logit biases, the min_new_tokens block on stop tokens, and grammar masks, in
        place on this step's logits (a fresh tensor every step)."""
        logits = logits[:, : self.vocab_size]
        for i, req in enumerate(reqs):
            p = req.params
            if p.has_penalties and req.num_output > 0:
                self._penalize(logits[i], req)
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), dtype=torch.int64, device=logits.device)
                logits[i, ids] += torch.tensor(
                    list(p.logit_bias.values()), dtype=logits.dtype, device=logits.device
                )
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
        return RowSampling.of(reqs).to_device(self.device)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        return self.ops.sample(logits, self.sampling_tensors(reqs), self.generator).tolist()
