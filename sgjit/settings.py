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

    @classmethod
    def read(cls) -> EnvSettings:
        return cls(
            cache_dir=Path(_env("CACHE_DIR", str(Path.home() / ".cache" / "sgjit"))).expanduser(),
            kernels=_env("KERNELS", "auto"),
            cpu_kernels=_env("CPU_KERNELS", "auto"),
        )


def env() -> EnvSettings:
    """Current settings (re-read each call so tests can monkeypatch the environment)."""
    return EnvSettings.read()
