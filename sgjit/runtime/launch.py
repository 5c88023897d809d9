"""`Launch`: one engine step (or multi-step launch) that is queued on the device and whose results the
host has not read yet. Its rows already carry placeholder tokens (futures.py) and their KV
bookkeeping, so the next step can be planned before this one finishes."""

from __future__ import annotations

from dataclasses import dataclass, field

from sgjit.runtime.logprobs import DeviceLogprobs
from sgjit.runtime.scheduler import RowChunk
from sgjit.runtime.transfer import Readback


@dataclass(slots=True)
class InputLogprobs:
    """Prompt logprobs one row of the launch owes: positions `first_pos ...` (device values)."""

    row: int
    first_pos: int
    values: DeviceLogprobs
    with_first: bool  # the prompt's first token (no logprob) is recorded first


@dataclass(slots=True)
class Launch:
    rows: list[RowChunk]
    sampled: list[int]  # rows (indices into `rows`) that draw tokens
    counts: list[int]  # tokens each sampled row draws: 1, or its multi-step budget
    bases: list[int]  # where each sampled row's first placeholder sits in its `Request.tokens`
    multi: bool
    # read back in this order: the tokens ([n], or [steps, n] for multi), then every
    # `input_logprobs` entry's tensors, then every `output_logprobs` value's
    readback: Readback
    input_logprobs: list[InputLogprobs] = field(default_factory=list)
    output_logprobs: dict[int, DeviceLogprobs] = field(default_factory=dict)  # sampled index -> values
    host_seconds: float = 0.0  # engine-thread time spent on it, device waits excluded
    completed: bool = False


class LaunchFailed(Exception):
    """A launch raised before anything of it was committed: its rows are rerun one by one."""

    def __init__(self, rows: list[RowChunk], error: Exception, multi: bool) -> None:
        super().__init__(str(error))
        self.rows = rows
        self.error = error
        self.multi = multi
