"""Log-probs in two halves: the engine computes them on the device when it launches a step
(`DeviceLogprobs`, read back with the step's tokens), and the output thread turns the numbers into
`LogprobEntry`s, token text included (`HostLogprobs.entries`) — the text is the costly part."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from sgjit.runtime.result import LogprobEntry


@dataclass(slots=True)
class DeviceLogprobs:
    """For m positions: the log-prob of each target token and, when asked, the top-n (values, ids)."""

    chosen: torch.Tensor  # [m]
    top_vals: torch.Tensor | None  # [m, n]
    top_ids: torch.Tensor | None  # [m, n]

    @classmethod
    def of(cls, logprobs: torch.Tensor, targets: torch.Tensor, top_n: int) -> DeviceLogprobs:
        """`logprobs` [m, vocab] (log-softmax), `targets` int64 [m] on the same device."""
        chosen = logprobs.gather(1, targets[:, None])[:, 0]
        if top_n <= 0:
            return cls(chosen, None, None)
        vals, ids = logprobs.topk(top_n, dim=-1)
        return cls(chosen, vals, ids)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.chosen, self.top_vals, self.top_ids) if t is not None]


@dataclass(slots=True)
class HostLogprobs:
    """`DeviceLogprobs` read back: plain numbers, safe to hand to another thread."""

    chosen: list[float]
    tops: list[list[tuple[float, int]]] | None

    @classmethod
    def read(cls, device: DeviceLogprobs, host: Iterator[torch.Tensor]) -> HostLogprobs:
        """Take this request's tensors, in `DeviceLogprobs.tensors` order, from the read-back ones."""
        chosen = next(host).tolist()
        if device.top_vals is None:
            return cls(chosen, None)
        vals, ids = next(host).tolist(), next(host).tolist()
        return cls(chosen, [list(zip(v, i)) for v, i in zip(vals, ids)])

    def entries(
        self, token_ids: list[int], text: Callable[[int], str] | None
    ) -> tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]:
        """(logprob, id, text) of each chosen token and, when asked, of the best at each position."""
        entries = [(lp, t, text(t) if text else None) for lp, t in zip(self.chosen, token_ids)]
        if self.tops is None:
            return entries, None
        return entries, [[(v, i, text(i) if text else None) for v, i in row] for row in self.tops]
