"""Building the C++ CPU kernels on first use, for the widest instruction set this CPU has (AVX-512
with VNNI, AVX-512, AVX2 + FMA, or portable C++), into `SGJIT_CACHE_DIR/cpu_kernels/`. A build is
named by its instruction set and a digest of its sources and flags, so a changed source or another
CPU builds anew and a later process loads the cached library in well under a second.

`SGJIT_CPU_KERNELS` picks: `auto` (default), `off` (torch ops and dequantized weights), or one
tier by name (tests build `portable` next to the native one: both must agree bit for bit). Without
a compiler, or when the build fails, the torch ops serve instead; that is logged once."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch

from sgjit.settings import env

log = logging.getLogger(__name__)

SOURCES = ("gemm.cpp", "elementwise.cpp", "attention.cpp", "module.cpp")
HEADERS = ("common.h",)
_AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c")
# tier -> (/proc/cpuinfo flags it needs, compiler flags), widest first
TIERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512vnni": (
        (*_AVX512, "avx512_vnni"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"),
    ),
    "avx512": (_AVX512, ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c")),
    "avx2": (("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
    "portable": ((), ()),
}
# -ffp-contract=off: no a*b+c fused behind our back, so every tier rounds alike
COMMON_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off", "-fno-math-errno")

_modules: dict[str, ModuleType | None] = {}
_lock = threading.Lock()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere, which means the portable tier)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def best_tier(flags: set[str]) -> str:
    return next(t for t, (needs, _) in TIERS.items() if set(needs) <= flags)


def requested_tier() -> str | None:
    """The tier `SGJIT_CPU_KERNELS` asks for (None = off); an unknown or unsupported one is refused
    with a warning and the best one used."""
    choice = env().cpu_kernels
    if choice == "off":
        return None
    best = best_tier(cpu_flags())
    if choice == "auto":
        return best
    if choice not in TIERS or not set(TIERS[choice][0]) <= cpu_flags():
        log.warning(
            "SGJIT_CPU_KERNELS=%s is not a tier this CPU runs (%s); using %s", choice, list(TIERS), best
        )
        return best
    return choice


def native(tier: str | None = None) -> ModuleType | None:
    """The compiled kernels for `tier` (default: `requested_tier()`), built on first use; None when
    they are off or cannot be built (logged once per tier)."""
    tier = tier if tier is not None else requested_tier()
    if tier is None:
        return None
    with _lock:
        if tier not in _modules:
            _modules[tier] = _build(tier)
        return _modules[tier]


def _build(tier: str) -> ModuleType | None:
    from torch.utils.cpp_extension import load

    here = Path(__file__).parent
    flags = [*COMMON_FLAGS, *TIERS[tier][1]]
    digest = hashlib.sha256(
        "\0".join([torch.__version__, *flags, *((here / f).read_text() for f in SOURCES + HEADERS)]).encode()
    ).hexdigest()[:12]
    name = f"sgjit_cpu_{tier}_{digest}"
    directory = env().cache_dir / "cpu_kernels" / name
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # torch's load() guards a build with a plain `lock` file that a killed build leaves behind,
        # after which every later process waits on it forever, silently (a server stopped during its
        # first start never started again). Builds here take an OS lock instead, which dies with its
        # holder; under it, a `lock` file can only be such a leftover.
        with open(directory / "build.flock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (directory / "lock").unlink(missing_ok=True)
            module = load(
                name, [str(here / f) for f in SOURCES], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(here)], build_directory=str(directory), verbose=False,
            )  # fmt: skip
    except Exception as e:  # no compiler, no ninja, a failed build: the torch ops serve instead
        log.warning(
            "sgjit's C++ CPU kernels (%s) could not be built, so the CPU runs on torch ops with "
            "dequantized weights (slower). Cause: %s",
            tier, str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__,
        )  # fmt: skip
        return None
    log.info("C++ CPU kernels: %s build from %s", module.isa(), directory)
    return module


def seed_cache(cache_dir: Path) -> None:
    """Copy this process's build (built or loaded now if need be) into another cache dir, so a process
    started on that dir (a benchmark's or a test's fresh cache for the plan JIT) loads it rather than
    rebuilding it (~20 s on a 2-core machine). No build, nothing copied."""
    module = native()
    if module is None:
        return
    built = Path(module.__file__).parent
    copy = cache_dir / "cpu_kernels" / built.name
    if not copy.exists():
        shutil.copytree(built, copy, ignore=shutil.ignore_patterns("build.flock", "lock"))
