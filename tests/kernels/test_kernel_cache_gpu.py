"""Compiled kernels persist on disk (CuPy's kernel cache under SGJIT_CACHE_DIR/cupy). A corrupt or
truncated cache file must be ignored and rebuilt, never crash a process or load a bad cubin. Each
step runs in a fresh process so the in-memory module cache does not hide the disk. Skipped without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

# Compile (or load from disk) the silu_mul kernel and check one launch against the reference.
_CHILD = """
import torch
from sgjit.kernels import reference
from sgjit.kernels.cuda.activation import SiluMul
x = torch.randn(8, 2 * 1024, device="cuda", dtype=torch.bfloat16)
out = SiluMul(torch.bfloat16, "bfloat16", 132)(x)
torch.testing.assert_close(out, reference.silu_mul(x), rtol=2e-2, atol=2e-2)
print("ok")
"""


def _run(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGJIT_CACHE_DIR": str(cache)}
    env.pop("CUPY_CACHE_DIR", None)
    return subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_kernel_cache_file_is_rebuilt(tmp_path, damage):
    first = _run(tmp_path)
    assert first.returncode == 0 and "ok" in first.stdout, first.stderr[-2000:]
    files = [p for p in (tmp_path / "cupy").rglob("*") if p.is_file()]
    assert files, "the first process left no compiled kernel on disk"
    damaged = {}
    for f in files:
        data = f.read_bytes()
        bad = {"truncate": data[: len(data) // 3], "garbage": os.urandom(len(data)), "empty": b""}[damage]
        f.write_bytes(bad)
        damaged[f] = bad
    second = _run(tmp_path)
    assert second.returncode == 0 and "ok" in second.stdout, second.stderr[-2000:]
    after = {p: p.read_bytes() for p in (tmp_path / "cupy").rglob("*") if p.is_file()}
    assert any(after.get(f) != bad for f, bad in damaged.items()) or set(after) - set(damaged), (
        "the damaged cache was neither rewritten nor replaced"
    )
