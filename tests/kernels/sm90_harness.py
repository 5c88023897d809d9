"""Debug harness for the Hopper prefill kernel (attention_sm90.cu), for GPU runs that may hang.

    python tests/kernels/sm90_harness.py OUT.jsonl [--budget 150] [--case-timeout 20] [--schedule S]

writes one JSON line per event to OUT.jsonl and stdout, flushed as it goes:

- compile: every config / tile the run needs is built in its own child process, all in parallel
  (`{"compiling": ...}`, then `{"compiled": ..., "s": ...}` or an error), filling CuPy's disk cache
  for the case runs and for a later pytest run; a build past --compile-timeout is `compile_hang`.
- cases, smallest first: two tokens (one key tile) on every config and tile, the same on the build
  without the watchdog, the structured-input diagnoses, then the GPU tests' batches. One child
  process runs them in turn; a case that prints nothing for --case-timeout seconds is
  `{"hang": true}`, a child that dies is `{"crash": true}` (both with the child's last output, the
  watchdog's device printf included), and a fresh child takes the remaining cases. After a hang,
  crash or sticky CUDA error the rest of that build's cases are skipped (listed in one line), so a
  deadlock costs one timeout, not one per case.
- `{"summary": ...}`: how many cases passed, failed, hung, crashed, were skipped or not reached
  within --budget seconds.

--schedule S (a registry SM90_SCHEDULES value, e.g. 4 for the TMA producer alone) runs only that
schedule: every config on the selector's geometry with it, and its other geometries.

Children build the kernel with its barrier watchdog (SGJIT_SM90_WATCHDOG, --watchdog-ms) except
the builds marked `"watchdog": false`, so a barrier deadlock traps with a line naming the barrier,
tile, block and warp; a hang that remains is outside the mbarriers (setmaxnreg, a named barrier)."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO

from test_attention_sm90_gpu import ATTN_TOL, BATCHES, CONFIGS, TILE_BATCHES, cfg_id, check, make_op

DIAGNOSES = ("equal keys", "V = d / D", "Q = 0")
SMOKE = "2 tokens"
STARTUP_TIMEOUT = 60.0  # a child's imports and CUDA context


@dataclass(frozen=True)
class Build:
    """One PagedAttention op: a config, the sm_90 tile (None: the selector's geometry, with
    `schedule` where given), watchdog or not."""

    cfg: int
    tile: str | None
    watchdog: bool
    schedule: int | None = None

    def describe(self) -> dict:
        tile = self.tile or ("selected" if self.schedule is None else f"selected, schedule {self.schedule}")
        return {"cfg": cfg_id(CONFIGS[self.cfg]), "tile": tile, "watchdog": self.watchdog}


@dataclass(frozen=True)
class Case:
    build: int
    batch: str  # a BATCHES label, or a DIAGNOSES label


def _tile_names(schedule: int | None) -> list[str]:
    from sgjit.kernels.registry import SM90_PREFILL_TILES

    return [t.name for t in SM90_PREFILL_TILES if schedule is None or t.schedule == schedule]


def _builds(schedule: int | None) -> list[Build]:
    """Every config on the selector's tile (its geometry with `schedule` where given), the other
    registered tiles (of `schedule`) on the first config, and the production build without the
    watchdog. The selector's tile for CONFIGS[0] is the first registered one (test_kernels_select
    checks it), so is the first of each schedule's geometry."""
    return (
        [Build(c, None, True, schedule) for c in range(len(CONFIGS))]
        + [Build(0, t, True) for t in _tile_names(schedule)[1:]]
        + [Build(0, None, False, schedule)]
    )


BUILDS: list[Build] = []
PRODUCTION = 0
CASES: list[Case] = []
SCHEDULE: int | None = None


def configure(schedule: int | None) -> None:
    """The builds and cases of a run (parent and children alike: cases travel as indices)."""
    global BUILDS, PRODUCTION, CASES, SCHEDULE
    SCHEDULE = schedule
    BUILDS = _builds(schedule)
    PRODUCTION = len(BUILDS) - 1
    CASES = _cases()


def _cases() -> list[Case]:
    """Smallest and most telling first, so a run cut short still says the most."""
    labels = [b[0] for b in BATCHES]
    watched = range(PRODUCTION)
    cases = [Case(b, SMOKE) for b in watched] + [Case(PRODUCTION, SMOKE)]
    cases += [Case(b, d) for b in (0, 3) for d in DIAGNOSES]
    for b in watched:
        wanted = TILE_BATCHES if BUILDS[b].tile else labels
        cases += [Case(b, label) for label in labels if label in wanted and label != SMOKE]
    cases += [Case(PRODUCTION, label) for label in ("ragged rows", "4097")]
    return cases


configure(None)


def describe(i: int) -> dict:
    c = CASES[i]
    return {"i": i, **BUILDS[c.build].describe(), "case": c.batch}


# ---- child side ------------------------------------------------------------------------------------


def _say(line: dict) -> None:
    print(json.dumps(line), flush=True)
    _LIBC.fflush(None)  # C stdio too: the device printf of a trapped kernel goes there, fully buffered


_LIBC = ctypes.CDLL(None)


def _build_op(build: Build, watchdog_ms: int):
    from sgjit.kernels.registry import SM90_PREFILL_TILES

    os.environ["SGJIT_SM90_WATCHDOG"] = str(watchdog_ms if build.watchdog else 0)
    tile = next((t for t in SM90_PREFILL_TILES if t.name == build.tile), None)
    _say({"compiling": build.describe()})
    t0 = time.perf_counter()
    op = make_op(CONFIGS[build.cfg], tile, build.schedule)
    sm90 = op.sm90.tile.name if op.sm90 is not None else None
    _say({"compiled": build.describe(), "s": round(time.perf_counter() - t0, 2), "sm90": sm90})
    return op


def _diagnose(op, cfg: tuple, label: str) -> dict:
    """Structured inputs that isolate one half of the kernel when random inputs fail: equal keys make
    P uniform whatever Q K^T computes (only P V, the V layout and the normalisation matter);
    V[key, d] = d / D makes the output d / D whatever P is (only the normalisation and V's head_dim
    blocks); Q = 0 makes S = 0 (uniform P through the real Q K^T path)."""
    import torch

    from sgjit.kernels import reference
    from sgjit.kernels.synthetic import paged_attention_case

    dtype, hq, hkv, d, page = cfg
    case = paged_attention_case([300, 70], [300, 170], hq, hkv, d, page, dtype, dtype, "cuda", seed=7)
    if label == "equal keys":
        case.kv.k.copy_(torch.randn(d, device="cuda").to(dtype).expand_as(case.kv.k))
    elif label == "V = d / D":
        case.kv.v.copy_((torch.arange(d, device="cuda") / d).to(dtype).expand_as(case.kv.v))
    else:
        case.q.zero_()
    res = op(case.q, case.kv, case.meta, d**-0.5).double()
    ref = reference.attention(case.q.float(), case.kv, case.meta, d**-0.5).double()
    err = ((res - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    nan = int(torch.isnan(res).sum())
    return {"err": err, "nan": nan, "ok": nan == 0 and err < ATTN_TOL[dtype]}


def _run_case(op, case: Case) -> dict:
    import torch

    cfg = CONFIGS[BUILDS[case.build].cfg]
    if case.batch in DIAGNOSES:
        line = _diagnose(op, cfg, case.batch)
    else:
        seed, (_, q_lens, kv_lens) = next((i, b) for i, b in enumerate(BATCHES) if b[0] == case.batch)
        res = check(op, cfg, q_lens, kv_lens, seed=seed)
        worst = sorted(res["rows"], key=lambda r: -r["err"])[:3]
        ok = res["nan"] == 0 and all(r["err"] < ATTN_TOL[cfg[0]] for r in res["rows"])
        line = {"err": round(res["err"], 6), "max_abs": res["max_abs"], "nan": res["nan"], "ok": ok,
                "worst_rows": worst}  # fmt: skip
    torch.cuda.synchronize()
    return line | {"sm90_ran": op._plan.kernel is op.sm90}


def _cuda_alive() -> bool:
    """False after a sticky error (a trap, an illegal access): the context is lost for this process."""
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:
        return False


def child(indices: list[int], watchdog_ms: int) -> None:
    import cupy
    import torch

    _say({"started": os.getpid(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "cupy": cupy.__version__})  # fmt: skip
    ops: dict[int, object] = {}
    for i in indices:
        case = CASES[i]
        if case.build not in ops:
            try:
                ops[case.build] = _build_op(BUILDS[case.build], watchdog_ms)
            except Exception as e:
                ops[case.build] = e
        op = ops[case.build]
        t0 = time.perf_counter()
        fatal = False
        if isinstance(op, Exception):
            line = {"error": f"build failed: {op!r}"[:2000]}
        else:
            try:
                line = _run_case(op, case)
            except Exception as e:
                line = {"error": repr(e)[:2000]}
                fatal = not _cuda_alive()
        _say(
            describe(i)
            | {"s": round(time.perf_counter() - t0, 3)}
            | line
            | ({"fatal": True} if fatal else {})
        )
        if fatal:
            os._exit(3)  # the context is gone: a fresh child takes the next case


def compile_child(b: int, watchdog_ms: int) -> None:
    """Build b, and its twin without the watchdog (the binary pytest runs) unless that is a build too."""
    builds = [BUILDS[b]]
    twin = Build(BUILDS[b].cfg, BUILDS[b].tile, False, BUILDS[b].schedule)
    if twin not in BUILDS:
        builds.append(twin)
    failed = False
    for build in builds:
        try:
            _build_op(build, watchdog_ms)
        except Exception as e:
            _say({"compile_error": build.describe(), "error": repr(e)[:2000]})
            failed = True
    sys.exit(1 if failed else 0)


# ---- parent side -----------------------------------------------------------------------------------


class Log:
    """The JSONL sink and stdout, every line flushed; counts for the summary."""

    def __init__(self, path: str) -> None:
        self.file: IO[str] = open(path, "w")  # noqa: SIM115
        self.counts: dict[str, int] = {}

    def __call__(self, line: dict, count: str | None = None) -> None:
        if count:
            self.counts[count] = self.counts.get(count, 0) + 1
        text = json.dumps(line)
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()


class Child:
    """A child process in its own session (so a kill takes what it started), its merged stdout and
    stderr read by a thread into a queue; None marks the end. It runs this run's schedule."""

    current: list[Child] = []

    def __init__(self, args: list[str]) -> None:
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        if SCHEDULE is not None:
            args = [*args, "--schedule", str(SCHEDULE)]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, env=env, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: list[str] = []  # output that is not a JSON line: tracebacks, device printf
        threading.Thread(target=self._read, daemon=True).start()
        Child.current.append(self)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next(self, timeout: float) -> dict | None | str:
        """The next JSON line, None at the end of output, or "timeout"."""
        while True:
            try:
                line = self.lines.get(timeout=max(timeout, 0.1))
            except queue.Empty:
                return "timeout"
            if line is None:
                return None
            try:
                obj = json.loads(line)
                if isinstance(obj, dict):
                    return obj
            except ValueError:
                pass
            self.tail = (self.tail + [line[:500]])[-30:]

    def kill(self) -> int:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rc = self.proc.wait()
        if self in Child.current:
            Child.current.remove(self)
        return rc


def compile_all(log: Log, watchdog_ms: int, timeout: float) -> None:
    children = {
        b: Child(["--compile", str(b), "--watchdog-ms", str(watchdog_ms)]) for b in range(len(BUILDS))
    }
    end = time.monotonic() + timeout
    pending = dict(children)
    while pending:
        for b, ch in list(pending.items()):
            msg = ch.next(0.2)
            if msg == "timeout":
                if time.monotonic() > end:
                    log({"compile_hang": BUILDS[b].describe(), "output": ch.tail}, "compile_hang")
                    ch.kill()
                    del pending[b]
                continue
            if msg is None:
                rc = ch.kill()
                if rc != 0:
                    log(
                        {"compile_failed": BUILDS[b].describe(), "rc": rc, "output": ch.tail},
                        "compile_failed",
                    )
                del pending[b]
            else:
                log(msg)


def run_cases(log: Log, watchdog_ms: int, case_timeout: float, deadline: float) -> list[int]:
    """Every case in order, a fresh child after each hang or crash; returns the cases not reached."""
    remaining = list(range(len(CASES)))

    def skip_rest_of(build: int, why: str) -> None:
        skipped = [i for i in remaining if CASES[i].build == build]
        if skipped:
            log(BUILDS[build].describe() | {"skipped": [CASES[i].batch for i in skipped], "why": why}, None)
            log.counts["skipped"] = log.counts.get("skipped", 0) + len(skipped)
            remaining[:] = [i for i in remaining if i not in skipped]

    while remaining and time.monotonic() < deadline:
        ch = Child(["--child", ",".join(map(str, remaining)), "--watchdog-ms", str(watchdog_ms)])
        phase, since = "startup", time.monotonic()
        while True:
            limit = {"startup": STARTUP_TIMEOUT, "compile": 2 * STARTUP_TIMEOUT}.get(phase, case_timeout)
            msg = ch.next(min(since + limit, deadline) - time.monotonic())
            if msg == "timeout":
                ch.kill()
                if time.monotonic() >= deadline and time.monotonic() < since + limit:
                    return remaining  # out of budget, not a hang
                if phase == "startup":
                    log(
                        {
                            "startup_hang": True,
                            "waited_s": round(time.monotonic() - since, 1),
                            "output": ch.tail,
                        }
                    )
                    return remaining
                i = remaining.pop(0)
                log(describe(i) | {"hang": True, "phase": phase, "waited_s": round(time.monotonic() - since, 1),
                                   "output": ch.tail}, "hang")  # fmt: skip
                skip_rest_of(CASES[i].build, f"case {i} hung")
                break
            if msg is None:
                rc = ch.kill()
                if phase == "startup":
                    log({"startup_failed": rc, "output": ch.tail})
                    return remaining
                if remaining and rc != 3:  # 3: the child reported its fatal case itself
                    i = remaining.pop(0)
                    log(describe(i) | {"crash": True, "rc": rc, "output": ch.tail}, "crash")
                    skip_rest_of(CASES[i].build, f"case {i} crashed the process")
                break
            since = time.monotonic()
            if "started" in msg or "compiled" in msg:
                phase = "case"
                log(msg)
            elif "compiling" in msg:
                phase = "compile"
                log(msg)
            elif msg.get("i") == (remaining[0] if remaining else None):
                i = remaining.pop(0)
                if ch.tail:
                    msg["output"] = ch.tail
                    ch.tail = []
                outcome = "fatal" if msg.get("fatal") else "ok" if msg.get("ok") else "failed"
                log(msg, outcome)
                if msg.get("fatal"):
                    skip_rest_of(CASES[i].build, f"case {i} left a sticky CUDA error")
            else:
                log(msg)
    return remaining


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="sm90_debug.jsonl")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the whole run")
    ap.add_argument("--case-timeout", type=float, default=20.0)
    ap.add_argument("--compile-timeout", type=float, default=90.0)
    ap.add_argument("--watchdog-ms", type=int, default=1000)
    ap.add_argument("--schedule", type=int, help="only this sm_90 schedule (registry SM90_SCHEDULES)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--compile", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    configure(args.schedule)
    if args.child is not None:
        child([int(i) for i in args.child.split(",")], args.watchdog_ms)
        return
    if args.compile is not None:
        compile_child(args.compile, args.watchdog_ms)
        return

    def on_term(signum, frame):  # the outer `timeout`: take the children along
        for ch in list(Child.current):
            ch.kill()
        sys.exit(124)

    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + args.budget
    log = Log(args.out)
    log({"harness": "sm90", "cases": len(CASES), "builds": [b.describe() for b in BUILDS],
         "budget_s": args.budget, "case_timeout_s": args.case_timeout, "watchdog_ms": args.watchdog_ms})  # fmt: skip
    t0 = time.monotonic()
    log({"compiling": "all builds in parallel"})
    compile_all(log, args.watchdog_ms, min(args.compile_timeout, deadline - time.monotonic()))
    log({"compiled": "all builds", "s": round(time.monotonic() - t0, 1)})
    not_run = run_cases(log, args.watchdog_ms, args.case_timeout, deadline)
    log({"summary": log.counts | {"not_run": len(not_run)}, "s": round(time.monotonic() - t0, 1),
         "not_run": [describe(i) for i in not_run][:40]})  # fmt: skip


if __name__ == "__main__":
    main()
