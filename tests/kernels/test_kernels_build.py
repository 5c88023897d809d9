"""`python -m sgjit.kernels.nvcc_check --check` compiles every registered kernel instantiation with the
machine's nvcc for sm_80 and sm_90 (no GPU needed), and names the kernel that fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgjit.kernels.nvcc_check import FAMILY_ARCHS, find_nvcc, instantiations
from sgjit.kernels.sources import FAMILIES

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")


def _build(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sgjit.kernels.nvcc_check", "--check", "-j", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_every_family_has_instantiations():
    inst = instantiations()
    assert set(inst) == set(FAMILIES) == {
        "norm", "activation", "rope", "attention", "attention_sm90", "sampling", "gemv"
    }  # fmt: skip
    assert all(inst.values())
    assert len(instantiations(full=True)["attention"]) > len(inst["attention"])


@needs_nvcc
def test_build_check_compiles_everything_for_sm80_and_sm90():
    """One line per family and target: sm_80 and sm_90 for every family but the Hopper-only one,
    which builds for sm_90a alone."""
    proc = _build()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    targets = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[-1:] == ["ok"]]
    general = len(FAMILIES) - len(FAMILY_ARCHS)
    assert (targets.count("sm_80"), targets.count("sm_90"), targets.count("sm_90a")) == (general, general, 1)


@needs_nvcc
def test_build_check_names_the_failing_kernel():
    bad = "attention_kernel<float, float, 128, 4, 16, 1, 1, 4, 64, 3>"  # no fp32 mma: must not compile
    proc = _build("--arch", "sm_80", "--families", "sampling", "--extra", f"attention:{bad}")
    assert proc.returncode == 1
    assert bad in proc.stderr
