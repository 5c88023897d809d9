"""`ForwardBatch`: everything one forward pass needs, as device tensors. Built by the model runner
from the scheduled rows; passed to the model and down to every op."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgjit.kernels.ops import AttentionMetadata


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [N], the new tokens of every row, rows concatenated
    positions: torch.Tensor  # int64 [N]
    slot_mapping: torch.Tensor  # int64 [N], KV slot each new token is written to
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [M], which of the N hidden states become logits

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
