"""`python -m sgjit.kernels.nvcc_check --check` compiles every registered kernel instantiation with the
machine's nvcc for sm_80 and sm_90 (no GPU needed), and names the kernel that fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgjit.kernels.nvcc_check import find_nvcc, instantiations
from sgjit.kernels.sources import FAMILIES

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")


def _build(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sgjit.kernels.nvcc_check", "--check", "-j", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_every_family_has_instantiations():
    inst = instantiations()
    assert (
        set(inst)
        == set(FAMILIES)
        == {"norm", "activation", "rope", "attention", "decode", "sampling", "gemv"}
    )
    assert all(inst.values())
    assert len(instantiations(full=True)["attention"]) > len(inst["attention"])
    assert len(instantiations(full=True)["decode"]) > len(inst["decode"])


@needs_nvcc
def test_build_check_compiles_everything_for_sm80_and_sm90():
    proc = _build()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arch in ("sm_80", "sm_90"):
        assert proc.stdout.count(arch) == len(FAMILIES)  # one line per family


@needs_nvcc
def test_build_check_names_the_failing_kernel():
    bad = "attention_kernel<float, float, 128, 4, 16, 1, 1, 4, 64, 3>"  # no fp32 mma: must not compile
    proc = _build("--arch", "sm_80", "--families", "sampling", "--extra", f"attention:{bad}")
    assert proc.returncode == 1
    assert bad in proc.stderr
