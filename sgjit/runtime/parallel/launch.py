"""How a runtime's tensor-parallel ranks start and stop. Rank 0 is the process that builds the
`Runtime` (and, behind `sgjit serve`, the HTTP server); it calls `start_ranks`:

- spawned (`Runtime(tp=N)`, `sgjit serve --tp N`): rank 0 hosts a TCPStore on a free port of
  127.0.0.1 and starts ranks 1..N-1 as `python -m sgjit.runtime.parallel` processes, then
  watches them: a rank that dies breaks the group at once, with its exit code and error in the
  message, and the others are stopped with it. Fresh interpreters rather than multiprocessing's
  spawn, which re-runs the caller's main script in every child: a script without an
  `if __name__ == "__main__"` guard would start ranks recursively. Nothing outlives rank 0: a rank
  whose rank 0 died sees its sockets close and exits.
- torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, WORLD_SIZE = tp; across nodes too):
  every rank was started already; rank 0 serves, the others run `worker.serve_rank`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

from sgjit.errors import InvalidRequestError, TensorParallelError
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.device import rank_device
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.parallel.worker import error_key, serve_rank, started_key
from sgjit.settings import env

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # for every rank to import torch and reach the rendezvous
EXIT_WAIT_S = 10.0  # for ranks told to stop to exit before they are killed


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    """Where a process sits in a group started by torchrun (or any launcher setting its variables)."""

    rank: int
    size: int
    local_rank: int
    local_size: int

    @classmethod
    def read(cls, tp: int) -> LaunchEnv | None:
        """None without torchrun's variables (or with a world of one)."""
        e = os.environ
        if not all(k in e for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            return None
        size = int(e["WORLD_SIZE"])
        if size == 1:
            return None
        if size != tp:
            raise InvalidRequestError(
                f"torchrun started {size} processes (WORLD_SIZE) but tp is {tp}; pass --tp {size}", "tp"
            )
        return cls(
            rank=int(e["RANK"]), size=size, local_rank=int(e.get("LOCAL_RANK", e["RANK"])),
            local_size=int(e.get("LOCAL_WORLD_SIZE", size)),
        )  # fmt: skip

    def join(self, cfg: RuntimeConfig) -> TPGroup:
        # torch's env:// rendezvous: rank 0 hosts the store, or torchrun's agent already does
        store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=START_TIMEOUT_S)))
        return TPGroup.join(
            self.rank, self.size, self.local_rank, self.local_size, store,
            rank_device(cfg.device, self.local_rank), env().tp_timeout_s,
        )  # fmt: skip


class RankSet:
    """Rank 0's hold on its group: the group and the processes it started (none under torchrun)."""

    def __init__(
        self, group: TPGroup | None = None, procs: list[subprocess.Popen] | None = None, store=None
    ) -> None:
        self.group = group
        self.procs = procs or []  # rank i + 1's process at index i
        self.store = store
        self._closing = False

    def _dead(self) -> list[tuple[int, subprocess.Popen]]:
        return [(r + 1, p) for r, p in enumerate(self.procs) if p.poll() is not None]

    def wait_started(self) -> None:
        """Until every spawned rank reached the rendezvous; a rank that exits first fails the start."""
        deadline = time.monotonic() + START_TIMEOUT_S
        keys = [started_key(r + 1) for r in range(len(self.procs))]
        while not self.store.check(keys):
            if dead := self._dead():
                raise TensorParallelError(f"tensor-parallel ranks did not start: {self._describe(dead)}")
            if time.monotonic() > deadline:
                raise TensorParallelError(
                    f"tensor-parallel ranks did not start within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.05)

    def watch(self) -> None:
        for p in self.procs:
            threading.Thread(target=self._watch, args=(p,), name="sgjit-tp-watch", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        proc.wait()
        g = self.group
        if not self._closing and g is not None and not g.stopping and g.failure is None:
            g.fail("a rank's process exited")

    def on_break(self) -> str:
        """The group broke: say which ranks died and why, unblock collectives and stop the rest."""
        deadline = time.monotonic() + 2.0  # a collective can fail just before its peer's exit shows
        while not self._dead() and time.monotonic() < deadline:
            time.sleep(0.02)
        detail = self._describe(self._dead())
        if self.group is not None:
            self.group.abort()
        self.kill()
        return detail

    def _describe(self, dead: list[tuple[int, subprocess.Popen]]) -> str:
        parts = []
        for rank, p in dead:
            error = None
            if self.store is not None and self.store.check([error_key(rank)]):
                error = self.store.get(error_key(rank)).decode(errors="replace")
            parts.append(f"rank {rank} exited with code {p.returncode}" + (f": {error}" if error else ""))
        return "; ".join(parts)

    def kill(self) -> None:
        self._closing = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def close(self) -> None:
        """Wait for the ranks told to stop to exit; kill the ones that do not."""
        self._closing = True
        deadline = time.monotonic() + EXIT_WAIT_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank did not exit within %.0f s; killing it", EXIT_WAIT_S)
        self.kill()


def start_ranks(cfg: RuntimeConfig) -> RankSet | None:
    """Rank 0's group (None at tp=1), the other ranks started where torchrun did not start them."""
    if cfg.tp == 1:
        return None
    if dist.is_initialized():
        raise TensorParallelError(
            "a tensor-parallel runtime is already running in this process (torch.distributed allows one "
            "group per process); shut it down before starting another"
        )
    launch = LaunchEnv.read(cfg.tp)
    if launch is not None:
        if launch.rank != 0:
            raise InvalidRequestError(
                f"this process is torchrun rank {launch.rank}: only rank 0 builds a Runtime; run "
                "`sgjit serve` on every rank (the others serve rank 0's steps)",
                "tp",
            )
        return RankSet(launch.join(cfg))
    return _spawn(cfg)


def _spawn(cfg: RuntimeConfig) -> RankSet:
    wait = timedelta(seconds=START_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", 0, cfg.tp, is_master=True, wait_for_workers=False, timeout=wait)
    level = logging.getLogger("sgjit").getEffectiveLevel()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sgjit.runtime.parallel",
                str(rank),
                str(cfg.tp),
                "127.0.0.1",
                str(store.port),
                str(level),
                json.dumps(asdict(cfg)),
            ],
        )  # fmt: skip
        for rank in range(1, cfg.tp)
    ]
    ranks = RankSet(None, procs, store)
    try:
        ranks.wait_started()
        device = rank_device(cfg.device, 0)
        ranks.group = TPGroup.join(0, cfg.tp, 0, cfg.tp, store, device, env().tp_timeout_s)
    except BaseException:
        ranks.kill()
        raise
    ranks.group.on_break = ranks.on_break
    ranks.watch()
    pids = [p.pid for p in procs]
    log.info(
        "tensor parallel: %d ranks (this process is rank 0; ranks 1..%d are pids %s)",
        cfg.tp,
        cfg.tp - 1,
        pids,
    )
    return ranks


def serve_launched_rank(cfg: RuntimeConfig, launch: LaunchEnv) -> None:
    """A torchrun rank other than 0: join the group and follow rank 0 until it stops."""
    serve_rank(cfg, launch.join(cfg))
