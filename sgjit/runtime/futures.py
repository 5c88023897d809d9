"""`TokenFutures`: the tokens the last launch drew, kept on the device so the next launch can take
them as inputs before the host has seen them (overlap scheduling).

When a launch is queued, each row it samples gets placeholder tokens in `Request.tokens`: negative
ids that name a cell of this buffer (row i's k-th token of the launch). Lengths, positions and KV
slots are known on the host, so the scheduler plans the next step as usual; the next launch's
input ids are resolved on the device (`resolve`) and the host replaces the placeholders with the
real ids when the launch's results are read back. Only the launch in flight has placeholders: the
host reads a launch back before it plans the one after next, so one buffer suffices."""

from __future__ import annotations

import torch


class TokenFutures:
    def __init__(self, steps: int, width: int, device: torch.device) -> None:
        """Room for `steps` tokens (a multi-step launch) of up to `width` rows."""
        self.width = width
        self.tokens = torch.zeros(steps, width, dtype=torch.int64, device=device)

    def placeholder(self, step: int, row: int) -> int:
        return -(1 + step * self.width + row)

    def placeholders(self, row: int, count: int) -> range:
        """Row `row`'s placeholders for steps 0 .. count - 1 (`placeholder(k, row)` for each k)."""
        return range(-(1 + row), -(1 + row) - count * self.width, -self.width)

    def resolve(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` with each placeholder replaced by the token it names (device work only)."""
        flat = self.tokens.view(-1)
        return torch.where(ids < 0, flat[(-ids - 1).clamp_min(0)], ids)

    def publish(self, tokens: torch.Tensor) -> None:
        """A single step's sampled tokens (one a row) become what its placeholders name."""
        self.tokens[0, : tokens.shape[0]].copy_(tokens)
