"""`StepChannel`: rank 0's step messages to the other tensor-parallel ranks, over the group's gloo
control group. A message is a fixed header (kind and sizes), then one int64 tensor holding every
integer list of the step, lengths first, and, for sampled multi-step launches, one float64 tensor:
two or three small broadcasts a step, no pickling. The other ranks rebuild the `HostBatch` /
`DecodeRows` / `MultiStep` exactly and run the same `ModelRunner` method on it."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from sgjit.errors import TensorParallelError
from sgjit.runtime.forward_batch import DecodeRows, HostBatch, MultiStep
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.sampler import RowSampling

_HEADER = 5  # kind, int sections, int values, float sections, float values


class StepKind(enum.IntEnum):
    STOP = 0
    FORWARD = 1  # ModelRunner.run_batch(HostBatch)
    DECODE = 2  # ModelRunner.run_decode(DecodeRows)
    DECODE_MULTI = 3  # ModelRunner.run_multi(DecodeRows, MultiStep)


Step = tuple[StepKind, tuple[object, ...]]


class StepChannel:
    def __init__(self, group: TPGroup) -> None:
        self.group = group

    # ----- rank 0 -----
    @contextmanager
    def lead(self, kind: StepKind, *step: object) -> Iterator[None]:
        """Send the step, then run rank 0's share of it inside the block. Rank 0 failing inside a
        step after the others started it leaves them waiting in a collective it will never join:
        that breaks the group (the other ranks are stopped with it) instead of desynchronising it."""
        self.group.check()
        ints, floats = encode(kind, step)
        self._send(kind, ints, floats)
        try:
            yield
        except TensorParallelError:
            raise
        except Exception as e:
            raise self.group.fail(f"rank 0 failed inside a step: {type(e).__name__}: {e}") from e

    def stop(self) -> None:
        """Tell the other ranks to leave their loop (where the group still stands), then leave the group."""
        self.group.stopping = True
        try:
            if self.group.failure is None:
                self._send(StepKind.STOP, [], [])
        except TensorParallelError:
            pass
        finally:
            self.group.close()

    def _send(self, kind: StepKind, ints: list[Sequence[int]], floats: list[Sequence[float]]) -> None:
        int_flat = _flat(ints, np.int64)
        float_flat = _flat(floats, np.float64)
        header = torch.tensor(
            [kind, len(ints), int_flat.size, len(floats), float_flat.size], dtype=torch.int64
        )
        self.group.control_broadcast(header)
        if int_flat.size:
            self.group.control_broadcast(torch.from_numpy(int_flat))
        if float_flat.size:
            self.group.control_broadcast(torch.from_numpy(float_flat))

    # ----- the other ranks -----
    def recv(self) -> Step:
        header = self.group.control_broadcast(torch.zeros(_HEADER, dtype=torch.int64), idle=True).tolist()
        kind, n_ints, int_len, n_floats, float_len = header
        ints = self._sections(n_ints, int_len, torch.int64)
        floats = self._sections(n_floats, float_len, torch.float64)
        return StepKind(kind), decode(StepKind(kind), ints, floats)

    def _sections(self, count: int, length: int, dtype: torch.dtype) -> list[list]:
        if not count:
            return []
        flat = self.group.control_broadcast(torch.empty(length, dtype=dtype)).numpy()
        sizes = flat[:count].astype(np.int64)
        bounds = np.cumsum(np.concatenate([[count], sizes]))
        return [flat[bounds[i] : bounds[i + 1]].tolist() for i in range(count)]


def _flat(sections: list[Sequence], dtype: type) -> np.ndarray:
    """Section lengths (as this dtype) followed by the sections' values."""
    if not sections:
        return np.empty(0, dtype=dtype)
    return np.concatenate(
        [np.array([len(s) for s in sections], dtype=dtype), *(np.asarray(s, dtype=dtype) for s in sections)]
    )


# ----- the messages -----
def encode(kind: StepKind, step: tuple[object, ...]) -> tuple[list[Sequence[int]], list[Sequence[float]]]:
    if kind is StepKind.FORWARD:
        (b,) = step
        assert isinstance(b, HostBatch)
        ints = [b.input_ids, b.positions, b.slots, b.qo_indptr, b.kv_lens, b.logits_indices]
        return ints + _ragged(b.page_rows), []
    rows = step[0]
    assert isinstance(rows, DecodeRows)
    ints = [rows.tokens, rows.positions, rows.slots, *_ragged(rows.page_rows)]
    if kind is StepKind.DECODE:
        return ints, []
    multi = step[1]
    assert isinstance(multi, MultiStep)
    ints += [multi.budgets, [int(s) for s in multi.stop_on_eos]]
    s = multi.sampling
    if s is None:
        return ints, []
    return ints + [s.top_k, s.seeds, s.steps], [s.temperature, s.top_p, s.min_p]


def decode(kind: StepKind, ints: list[list], floats: list[list]) -> tuple[object, ...]:
    if kind is StepKind.STOP:
        return ()
    if kind is StepKind.FORWARD:
        ids, positions, slots, qo_indptr, kv_lens, logits_indices, lengths, pages = ints
        return (
            HostBatch(ids, positions, slots, qo_indptr, kv_lens, _unragged(lengths, pages), logits_indices),
        )
    tokens, positions, slots, lengths, pages = ints[:5]
    rows = DecodeRows(tokens, positions, slots, _unragged(lengths, pages))
    if kind is StepKind.DECODE:
        return (rows,)
    budgets, stop_on_eos = ints[5:7]
    sampling = None
    if floats:
        top_k, seeds, steps = ints[7:10]
        temperature, top_p, min_p = floats
        sampling = RowSampling(temperature, top_p, top_k, min_p, seeds, steps)
    return rows, MultiStep(budgets, [bool(s) for s in stop_on_eos], sampling)


def _ragged(rows: list[list[int]]) -> list[list[int]]:
    return [[len(r) for r in rows], [p for r in rows for p in r]]


def _unragged(lengths: list[int], flat: list[int]) -> list[list[int]]:
    out, at = [], 0
    for n in lengths:
        out.append(flat[at : at + n])
        at += n
    return out
