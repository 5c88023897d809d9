"""`python -m sgjit.kernels.nvcc_check --check` compiles every registered kernel instantiation with the
machine's nvcc for sm_80 and sm_90 (no GPU needed), and names the kernel that fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgjit.kernels.cuda.attention_sm90 import LAUNCH_REGS
from sgjit.kernels.nvcc_check import FAMILY_ARCHS, compile_unit, find_nvcc, instantiations, resource_lines
from sgjit.kernels.registry import SM90_SCHEDULES, SM90_TMA
from sgjit.kernels.sources import FAMILIES

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc on this machine")


def _build(*args: str) -> subprocess.CompletedProcess:
    """The build check as CI runs it: unoptimized (--quick), which still instantiates every template
    and assembles every PTX instruction for every target; the optimized builds below check registers."""
    cmd = [sys.executable, "-m", "sgjit.kernels.nvcc_check", "--check", "--quick", "-j", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_every_family_has_instantiations():
    inst = instantiations()
    assert set(inst) == set(FAMILIES) == {
        "norm", "activation", "rope", "attention", "attention_sm90", "decode", "lean_decode", "sampling", "gemv",
        "megakernel", "fp8_quant",
    }  # fmt: skip
    assert all(inst.values())
    assert len(instantiations(full=True)["attention"]) > len(inst["attention"])
    assert len(instantiations(full=True)["decode"]) > len(inst["decode"])
    assert len(instantiations(full=True)["lean_decode"]) > len(inst["lean_decode"])


def test_default_instantiations_cover_the_dense_model_presets():
    """The build check's default set reaches every dense preset's attention heads and hidden width,
    so a template change that breaks a benchmarked model's instantiation fails CI."""
    from sgjit.kernels.nvcc_check import HEAD_DIM_GROUPS, HIDDEN_WIDTHS
    from sgjit.runtime.model.presets import MODEL_SHAPES

    dense = [c for c in MODEL_SHAPES.values() if c.moe is None]
    assert len(dense) >= 5
    for c in dense:
        assert (c.head_dim, c.num_heads // c.num_kv_heads) in HEAD_DIM_GROUPS, c.name
        assert c.hidden_size in HIDDEN_WIDTHS, c.name


@needs_nvcc
def test_build_check_compiles_everything_for_sm80_and_sm90():
    """One line per family and target: sm_80 and sm_90 for every family but the Hopper-only one,
    which builds for sm_90a alone. That one (attention_sm90) builds optimized even under --quick, the
    very build the register test below makes and checks, so here it is left to that test (~35 s)."""
    general = [f for f in FAMILIES if f not in FAMILY_ARCHS]
    proc = _build("--families", *general)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    targets = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[-1:] == ["ok"]]
    assert (targets.count("sm_80"), targets.count("sm_90")) == (len(general), len(general))
    assert set(FAMILY_ARCHS) == {"attention_sm90"}  # the family left to the register test


@needs_nvcc
def test_build_check_names_the_failing_kernel():
    bad = "attention_kernel<float, float, 128, 4, 16, 1, 1, 4, 64, 3>"  # no fp32 mma: must not compile
    proc = _build("--arch", "sm_80", "--families", "sampling", "--extra", f"attention:{bad}")
    assert proc.returncode == 1
    assert bad in proc.stderr


@needs_nvcc
def test_sm90_kernels_hold_the_registers_their_setmaxnreg_split_moves():
    """attention_sm90.cu's warpgroups trade registers with setmaxnreg inside the CTA's own
    allocation, sized for LAUNCH_REGS a thread: a CTA built with fewer leaves a consumer warp in
    setmaxnreg.inc forever (as the 80/216 split hung the first GPU run). Every registered
    instantiation (every consumer schedule) gets exactly that many, without spills or serialized
    MMAs; the watchdog build (SGJIT_SM90_WATCHDOG, debug runs) compiles too, and keeps the count."""
    names = instantiations()["attention_sm90"]
    res = compile_unit(find_nvcc(), "attention_sm90", names, "sm_90a", True)
    assert res.ok, res.log[-3000:]
    regs = [int(line.split()[0]) for line in resource_lines(res.log)]
    assert regs == [LAUNCH_REGS] * len(names)
    assert all("spill 0/0 B" in line for line in resource_lines(res.log))
    # ptxas serializes the MMAs of a kernel (C7518) when it cannot prove an accumulator or P
    # fragment untouched while its MMA runs: that would undo the overlapped schedules
    assert "wgmma.mma_async instructions are serialized" not in res.log, res.log[-3000:]
    schedule_of = {n: int(n.rsplit(",", 1)[1].strip(" >")) for n in names}
    assert set(schedule_of.values()) == set(SM90_SCHEDULES)  # every schedule
    # the watchdog build of a cp.async and of a TMA producer (its printf in 24 registers)
    debug = [names[0], next(n for n in names if schedule_of[n] & SM90_TMA)]
    watchdog = compile_unit(
        find_nvcc(), "attention_sm90", debug, "sm_90a", True, ("SGJIT_SM90_WATCHDOG=1000",)
    )
    assert watchdog.ok, watchdog.log[-3000:]
    assert [int(line.split()[0]) for line in resource_lines(watchdog.log)] == [LAUNCH_REGS] * 2


@needs_nvcc
def test_megakernel_holds_smollm2_in_registers():
    """The decode megakernel at SmolLM2's heads, every rows bucket, on sm_90: one 512-thread CTA a SM
    (its __launch_bounds__ caps a thread at 128 registers) without spills, so its grid is the SM
    count and the GEMVs' accumulators stay in registers."""
    from sgjit.kernels.cuda.megakernel import megakernel_name
    from sgjit.kernels.registry import MEGAKERNEL_ROW_CHOICES

    names = [megakernel_name("bfloat16", b, 64, 3) for b in MEGAKERNEL_ROW_CHOICES]
    res = compile_unit(find_nvcc(), "megakernel", names, "sm_90", True)
    assert res.ok, res.log[-3000:]
    lines = resource_lines(res.log)
    assert len(lines) == len(names)
    assert all(int(line.split()[0]) <= 128 and "spill 0/0 B" in line for line in lines), lines
