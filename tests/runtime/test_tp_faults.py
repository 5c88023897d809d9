"""Faults of a tensor-parallel runtime end in an error, never a hang or a stray process: a rank that
dies (every later request fails at once, naming it), a rank that hangs (SGJIT_TP_TIMEOUT), rank 0
failing inside a step (the other rank, stuck in a collective, is stopped), and rank 0 killed (its
rank sees the sockets close and exits)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sgjit
from sgjit.errors import TensorParallelError

from conftest import tp_rank_pids, wait_ended
from tiny_gguf import write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.fixture
def tiny(tmp_path) -> str:
    return str(write_tiny_gguf(tmp_path / "tiny.gguf"))


def test_a_rank_that_dies_fails_every_request_with_its_exit(tiny):
    rt = sgjit.Runtime(tiny, device="cpu", max_total_tokens=512, tp=2)
    try:
        assert rt.generate("hello", GREEDY)["output_ids"]
        with pytest.raises(TensorParallelError, match="already running in this process"):
            sgjit.Runtime(tiny, device="cpu", max_total_tokens=512, tp=2)  # refused before starting ranks
        (rank1,) = tp_rank_pids()
        os.kill(rank1, signal.SIGKILL)
        for _ in range(2):  # the first request meets the dead rank, the next the broken group
            with pytest.raises(TensorParallelError, match=r"rank 1 exited with code -9; restart the runtime"):
                rt.generate("hello again", GREEDY)
        s = rt.stats()
        assert s["running"] == 0 and s["waiting"] == 0
    finally:
        rt.shutdown()
    assert not tp_rank_pids()


def test_a_rank_that_hangs_times_out(tiny, monkeypatch):
    monkeypatch.setenv("SGJIT_TP_TIMEOUT", "5")
    rt = sgjit.Runtime(tiny, device="cpu", max_total_tokens=512, tp=2)
    try:
        rt.generate("hello", GREEDY)
        (rank1,) = tp_rank_pids()
        os.kill(rank1, signal.SIGSTOP)
        with pytest.raises(TensorParallelError, match="broke at rank 0"):
            rt.generate("hello again", GREEDY)
    finally:
        rt.shutdown()
    assert wait_ended(rank1)  # killed with the group, stopped or not


def test_rank_0_failing_inside_a_step_stops_the_other_rank(tiny):
    rt = sgjit.Runtime(tiny, device="cpu", max_total_tokens=512, tp=2)
    try:
        (rank1,) = tp_rank_pids()

        def broken(*args, **kwargs):
            raise RuntimeError("injected fault in rank 0's forward")

        rt.engine.call(lambda: setattr(rt.model, "forward", broken))  # after the step reached rank 1
        with pytest.raises(TensorParallelError, match="rank 0 failed inside a step: RuntimeError: injected"):
            rt.generate("hello", GREEDY)
        assert wait_ended(rank1, timeout=10)  # not left waiting in the all-reduce rank 0 never joins
    finally:
        rt.shutdown()


def test_rank_0_killed_takes_its_ranks_with_it(tiny):
    script = (
        "import sgjit, sys\n"
        f"rt = sgjit.Runtime({tiny!r}, device='cpu', max_total_tokens=512, tp=2)\n"
        "rt.generate('hello', {'max_new_tokens': 2})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        (rank1,) = tp_rank_pids(proc.pid)
        proc.kill()
        proc.wait()
        assert wait_ended(rank1)
    finally:
        proc.kill()
