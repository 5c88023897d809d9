"""`ForwardBatch`: everything one forward pass needs, as device tensors; and the host descriptions
of a step that the model runner builds from the scheduled rows (`HostBatch`, `DecodeRows`,
`MultiStep`). The host forms are what rank 0 of a tensor-parallel runtime sends to the other ranks,
which then run the very same step from them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sgjit.kernels.ops import AttentionMetadata
from sgjit.runtime.sampler import RowSampling
from sgjit.runtime.transfer import to_device


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


@dataclass(slots=True)
class HostBatch:
    """A `ForwardBatch` as host lists."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    qo_indptr: list[int]  # [B+1]
    kv_lens: list[int]  # [B]
    page_rows: list[list[int]]  # each row's pages
    logits_indices: list[int]

    def to_device(self, device: torch.device, page_size: int) -> ForwardBatch:
        """The batch on `device`, copied without waiting for work already queued there (transfer.py):
        with overlap scheduling the step before may still be running."""
        table = np.zeros((len(self.page_rows), max(map(len, self.page_rows))), dtype=np.int32)
        for b, pages in enumerate(self.page_rows):
            table[b, : len(pages)] = pages
        page_table = torch.from_numpy(table)
        qo = self.qo_indptr
        meta = AttentionMetadata(
            qo_indptr=to_device(qo, torch.int32, device),
            kv_lens=to_device(self.kv_lens, torch.int32, device),
            page_table=page_table if device.type == "cpu" else page_table.to(device, non_blocking=True),
            page_size=page_size,
            max_q_len=max(qo[i + 1] - qo[i] for i in range(len(self.kv_lens))),
            max_kv_len=max(self.kv_lens),
            qo_indptr_host=qo,
            kv_lens_host=self.kv_lens,
        )
        return ForwardBatch(
            input_ids=to_device(self.input_ids, torch.int64, device),
            positions=to_device(self.positions, torch.int64, device),
            slot_mapping=to_device(self.slots, torch.int64, device),
            attn=meta,
            logits_indices=to_device(self.logits_indices, torch.int64, device),
        )


@dataclass(slots=True)
class DecodeRows:
    """A decode step on the bucketed (CUDA-graph) path: row i feeds `tokens[i]` at `positions[i]`,
    writes its KV at `slots[i]` and attends through `page_rows[i]`."""

    tokens: list[int]
    positions: list[int]
    slots: list[int]
    page_rows: list[list[int]]


@dataclass(slots=True)
class MultiStep:
    """What a multi-step launch adds to its `DecodeRows`: each row's token budget, whether it stops
    at EOS, and its sampling parameters (None: every row greedy)."""

    budgets: list[int]
    stop_on_eos: list[bool]
    sampling: RowSampling | None
