"""Environment settings, all prefixed `SGJIT_`, read in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(f"SGJIT_{name}", default)


@dataclass(frozen=True, slots=True)
class EnvSettings:
    cache_dir: Path
    kernels: str  # "auto" | "reference" | "op=variant,op=variant"
    cpu_kernels: str  # "auto" | "off" | a tier of sgjit/kernels/cpp/build.py ("avx2", "portable", ...)
    # seconds a tensor-parallel collective may wait for the other ranks before the runtime fails
    # with an error (a rank that hangs); a rank that dies is noticed at once
    tp_timeout_s: float
    # "1": on a CPU, decode steps take the bucketed static-shape path that CUDA graphs capture, run
    # uncaptured (as --no-cuda-graph runs it on a GPU): the graph path checked where there is no GPU
    eager_decode_graphs: bool
    # Debug builds of the sm_90 prefill kernel: a barrier wait longer than this many ms traps
    # (attention_sm90.cu's watchdog) instead of hanging; 0 builds the kernel without it.
    sm90_watchdog_ms: int
    # Kernels the selector does not offer by default (SGJIT_UNVERIFIED_KERNELS=1 offers them): a new
    # kernel until its GPU tests have passed, or one that passed but measured no faster than what it
    # would replace (today: the decode megakernel).
    unverified_kernels: bool
    # "1": profile windows (`--profile-dir`, `Runtime.profile`) also record Python call stacks, so a
    # trace shows which Python functions the host time went to (slower; bench.trace_summary reads it)
    profile_with_stack: bool
    # The GIL switch interval in microseconds a Runtime sets for its process when it starts, where
    # it is longer (Python's default is 5000): how long a thread waiting for the GIL lets the holder
    # run before asking it to let go. The engine thread drops the GIL at kernel launches and copies,
    # and while other threads (HTTP streaming, the output thread) run Python each wait to get it back
    # can cost up to this long. 1000 served 10% more tokens/s than 5000 in the 8B serving benchmark
    # (docs/performance.md); 0 leaves the interval alone.
    switch_interval_us: int
    # "0": decode kernels captured in CUDA graphs wait for the kernel before them to finish, as
    # plain launches do, instead of starting during its tail (programmatic dependent launch on
    # compute capability 9.0+, kernels/cuda/pdl.py)
    pdl: bool

    @classmethod
    def read(cls) -> EnvSettings:
        return cls(
            cache_dir=Path(_env("CACHE_DIR", str(Path.home() / ".cache" / "sgjit"))).expanduser(),
            kernels=_env("KERNELS", "auto"),
            cpu_kernels=_env("CPU_KERNELS", "auto"),
            tp_timeout_s=float(_env("TP_TIMEOUT", "180")),
            eager_decode_graphs=_env("EAGER_DECODE_GRAPHS", "0") == "1",
            sm90_watchdog_ms=int(_env("SM90_WATCHDOG", "0")),
            unverified_kernels=_env("UNVERIFIED_KERNELS", "0") == "1",
            profile_with_stack=_env("PROFILE_WITH_STACK", "0") == "1",
            switch_interval_us=int(_env("SWITCH_INTERVAL_US", "1000")),
            pdl=_env("PDL", "1") == "1",
        )


def env() -> EnvSettings:
    """Current settings (re-read each call so tests can monkeypatch the environment)."""
    return EnvSettings.read()
