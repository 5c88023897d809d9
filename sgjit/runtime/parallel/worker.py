"""What a tensor-parallel rank other than 0 runs: its share of the model, then rank 0's steps one by
one, until rank 0 says stop (or goes away, which ends the wait with an error)."""

from __future__ import annotations

import logging

import torch

from sgjit.runtime.assembly import build_model
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.model_runner import ModelRunner
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.parallel.step import StepChannel, StepKind

log = logging.getLogger(__name__)


def started_key(rank: int) -> str:
    return f"sgjit/started/{rank}"


def error_key(rank: int) -> str:
    return f"sgjit/error/{rank}"


def follow(runner: ModelRunner, channel: StepChannel) -> None:
    """Run rank 0's steps until it sends STOP."""
    run = {
        StepKind.FORWARD: runner.run_batch,
        StepKind.DECODE: runner.run_decode,
        StepKind.DECODE_MULTI: runner.run_multi,
    }
    while True:
        kind, step = channel.recv()
        if kind is StepKind.STOP:
            return
        run[kind](*step)


def serve_rank(cfg: RuntimeConfig, group: TPGroup) -> None:
    """Build this rank's share and follow rank 0 (the torch work of this process runs here)."""
    torch.set_grad_enabled(False)
    m = build_model(cfg, group)
    log.info("rank %d of %d ready on %s", group.rank, group.size, m.device)
    follow(ModelRunner(m.model, m.pool, m.futures, m.graphs), StepChannel(group))
    group.close()
