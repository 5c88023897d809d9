"""Batched sampling for one step: penalties, min-token and grammar masks on the logits, then the ops
table's `sample` (greedy / temperature / top-k / top-p / min-p, per-row seeds)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.kernels.ops import OpTable, SamplingTensors
from sgjit.runtime.request import Request
from sgjit.runtime.transfer import to_device


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
        return SamplingTensors(
            temperature=to_device(self.temperature, torch.float32, device),
            top_p=to_device(self.top_p, torch.float32, device),
            top_k=to_device(self.top_k, torch.int32, device),
            min_p=to_device(self.min_p, torch.float32, device),
            seeds=to_device(self.seeds, torch.int64, device),
            steps=to_device(self.steps, torch.int64, device),
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
        place on this step's logits (a fresh tensor every step). Penalties and grammars read the
        request's resolved tokens (the engine reads every launch back before such rows run again);
        the rest needs only host-known counts, and nothing here waits for the device."""
        logits = logits[:, : self.vocab_size]
        dev = logits.device
        for i, req in enumerate(reqs):
            p = req.params
            if p.has_penalties and req.num_output > 0:
                self._penalize(logits[i], req)
            if p.logit_bias:
                ids = to_device(list(p.logit_bias), torch.int64, dev)
                logits[i, ids] += to_device(list(p.logit_bias.values()), logits.dtype, dev)
            if req.num_output < p.min_new_tokens:
                block = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_ids))
                if block:
                    logits[i, to_device(block, torch.int64, dev)] = float("-inf")
        constrained = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if constrained:
            mask = torch.empty(len(constrained), reqs[constrained[0]].grammar.words, dtype=torch.int32)
            for j, i in enumerate(constrained):
                reqs[i].grammar.fill_bitmask(mask[j])
            idx = to_device(constrained, torch.int64, dev)
            rows = logits[idx]
            self.ops.apply_bitmask(rows, mask.to(logits.device, non_blocking=True))
            logits[idx] = rows
        return logits

    def _penalize(self, row: torch.Tensor, req: Request) -> None:
        p = req.params
        out = to_device(req.output_ids, torch.int64, row.device)
        if p.repetition_penalty != 1.0:
            seen = to_device(req.tokens, torch.int64, row.device).unique()
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def sampling_tensors(self, reqs: list[Request]) -> SamplingTensors:
        return RowSampling.of(reqs).to_device(self.device)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """The next token of each row, left on the device (int64 [rows])."""
        return self.ops.sample(logits, self.sampling_tensors(reqs), self.generator)
