"""`ModelComm`: where a forward pass meets the other tensor-parallel ranks. Four calls, each the
identity at tp=1: the vocabulary-parallel embedding lookup, the all-reduce after a row-parallel
GEMM, the logits all-gather, and rank 0's tokens handed to every rank inside a multi-step launch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgjit.runtime.parallel.group import TPGroup


@dataclass(slots=True)
class ModelComm:
    group: TPGroup = field(default_factory=TPGroup)
    vocab_start: int = 0  # the first vocabulary row this rank holds
    vocab_size: int = 0  # the whole vocabulary: gathered logits are cut to it (the rest is padding)

    @property
    def parallel(self) -> bool:
        """More than one rank (the model then runs the unfused ops: see LlamaModel.forward)."""
        return self.group.size > 1

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows for `ids`: each rank looks up the ids in its vocabulary rows and zeroes the
        rest, and the all-reduce adds the one real row to zeros (exact)."""
        if self.group.size == 1:
            return table[ids]
        rows = table.shape[0]
        local = ids - self.vocab_start
        x = table[local.clamp(0, rows - 1)]
        x.masked_fill_(((local < 0) | (local >= rows))[:, None], 0)
        return self.group.all_reduce(x)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial product (after o_proj and down)."""
        return self.group.all_reduce(partial)

    def logits(self, local: torch.Tensor) -> torch.Tensor:
        """The whole vocabulary's logits from every rank's slice, on every rank."""
        if self.group.size == 1:
            return local
        full = self.group.all_gather_last(local)
        return full if full.shape[-1] == self.vocab_size else full[:, : self.vocab_size].contiguous()

    def from_leader(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rank 0's tokens on every rank: a multi-step launch feeds back the tokens rank 0 picked, so
        the ranks cannot drift apart even where sampling draws differ between devices."""
        return self.group.broadcast(tokens)
