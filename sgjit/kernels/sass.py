"""`python -m sgjit.kernels.sass FAMILY NAME [--arch sm_90a]`: what ptxas made of one kernel
instantiation, without a GPU: nvcc builds the family's source with the name instantiated (as
nvcc_check does), `cuobjdump -sass` disassembles it, and the opcodes are counted, for the whole
kernel and for its largest loop (the instructions between a backward branch and its target, which
in a streaming kernel is the main loop a tile or page of work runs through).

The counts say where a kernel's instructions go before any profiler runs: in the Hopper prefill they
showed a third of the main loop spent on a mask that only a causal row's last tiles need
(docs/profiling.md). `--loops` lists every loop with the counts that tell a loop's MMAs were
serialized, their descriptors built outside the uniform registers, or registers spilled. cuobjdump ships with the CUDA toolkit and in the `nvidia-cuda-cuobjdump` wheel;
set CUOBJDUMP to its path where it is neither on PATH nor beside nvcc."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sgjit.kernels.nvcc_check import build_cubin, find_nvcc

# "/*0e60*/   @!P3 BRA 0x3b50 ;" -> address, predicate (optional), opcode with its modifiers, operands
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_FUNCTION = re.compile(r"Function : (\S+)")


@dataclass(slots=True)
class Instr:
    address: int
    opcode: str  # without modifiers: HGMMA, not HGMMA.64x128x16.F32.BF16
    text: str


def opcode(instruction: str) -> str:
    """An instruction's opcode without its predicate and modifiers: "@!P0 HGMMA.64x128x16 ..." -> HGMMA."""
    words = instruction.split()
    op = words[1] if len(words) > 1 and words[0].startswith("@") else words[0] if words else ""
    return op.split(".")[0]


def parse(sass: str) -> dict[str, list[Instr]]:
    """Mangled kernel name -> its instructions, from `cuobjdump -sass` output."""
    kernels: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in sass.splitlines():
        if m := _FUNCTION.search(line):
            current = kernels.setdefault(m.group(1), [])
        elif current is not None and (m := _INSTR.search(line)):
            text = f"{(m.group(2) or '').strip()} {m.group(3)} {m.group(4).strip()}".strip()
            current.append(Instr(int(m.group(1), 16), opcode(text), text))
    return kernels


def loops(instrs: list[Instr]) -> list[list[Instr]]:
    """Every loop's instructions (a conditional backward branch's span, target .. branch), in
    address order of their branches. Unconditional backward branches are left out: ptxas closes a
    loop with a predicated branch, and jumps back from out-of-line code (a divergent shuffle's slow
    path) without one."""
    spans = []
    for i, ins in enumerate(instrs):
        if ins.opcode != "BRA" or not ins.text.startswith("@"):
            continue
        if not (m := re.search(r"0x([0-9a-f]+)\s*$", ins.text)):
            continue
        target = int(m.group(1), 16)
        if target < ins.address:
            start = next((j for j, x in enumerate(instrs) if x.address >= target), i)
            spans.append(instrs[start : i + 1])
    return spans


def largest_loop(instrs: list[Instr]) -> list[Instr]:
    """The longest of `loops`, or none."""
    return max(loops(instrs), key=len, default=[])


# What a loop line counts beside its length: warpgroup MMAs; R2UR, a move from an ordinary to a uniform
# register (where the MMA descriptors are built in ordinary registers, a few before every HGMMA;
# built in uniform ones, UIADD3 instead); WARPGROUP.DEPBAR, a wait for MMAs (about one a GEMM; one
# after every HGMMA means ptxas serialized them); local-memory loads and stores (spills).
LOOP_COUNTS = ("HGMMA", "R2UR", "UIADD3", "DEPBAR", "LDL", "STL")


def loop_counts(loop: list[Instr]) -> dict[str, int]:
    counts = opcode_counts(loop)
    counts["DEPBAR"] = sum("WARPGROUP.DEPBAR" in ins.text for ins in loop)
    return {k: counts[k] for k in LOOP_COUNTS}


def opcode_counts(instrs: list[Instr]) -> Counter:
    return Counter(ins.opcode for ins in instrs)


def find_cuobjdump() -> str | None:
    nvcc = find_nvcc()
    beside = str(Path(nvcc).resolve().parent / "cuobjdump") if nvcc else None
    try:  # the nvidia-cuda-cuobjdump wheel
        import nvidia.cu13 as cu13  # type: ignore[import-not-found]

        wheel = str(Path(next(iter(cu13.__path__))) / "bin" / "cuobjdump")
    except ImportError:
        wheel = None
    for cand in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), beside, wheel):
        if cand and Path(cand).exists():
            return cand
    return None


def disassemble(family: str, name: str, arch: str) -> str:
    """The SASS of one instantiation (RuntimeError naming what is missing or what failed)."""
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    if nvcc is None or cuobjdump is None:
        raise RuntimeError(
            f"needs nvcc and cuobjdump (found {nvcc}, {cuobjdump}); see this module's docstring"
        )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / f"{family}.cubin"
        proc = build_cubin(nvcc, family, [name], arch, cubin)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {name}:\n{(proc.stdout + proc.stderr)[-2000:]}")
        out = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {out.stderr[-1000:]}")
    return out.stdout


def report(sass: str, top: int = 16, all_loops: bool = False) -> str:
    lines = []
    for kernel, instrs in parse(sass).items():
        loop = largest_loop(instrs)
        lines.append(f"{kernel}: {len(instrs)} instructions; largest loop {len(loop)}")
        for label, part in (("kernel", instrs), ("loop", loop)):
            common = opcode_counts(part).most_common(top)
            lines.append(f"  {label}: " + ", ".join(f"{op} {n}" for op, n in common))
        if all_loops:
            for each in loops(instrs):
                counts = ", ".join(f"{k} {n}" for k, n in loop_counts(each).items())
                lines.append(
                    f"  loop {each[0].address:#06x}-{each[-1].address:#06x}: {len(each)} instructions; {counts}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgjit.kernels.sass", description=__doc__.split("\n\n")[0])
    ap.add_argument("family", help="a kernel source family, e.g. attention_sm90")
    ap.add_argument(
        "name", help='a name expression, e.g. "attention_sm90_kernel<__nv_bfloat16, 128, 4, 16, 128, 3, 7>"'
    )
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--top", type=int, default=16, help="opcodes listed per part")
    ap.add_argument("--dump", metavar="FILE", help="also write the whole SASS here")
    ap.add_argument(
        "--loops",
        action="store_true",
        help="list every loop: length, MMAs, uniform-register moves, MMA waits, spills",
    )
    args = ap.parse_args(argv)
    try:
        sass = disassemble(args.family, args.name, args.arch)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    if args.dump:
        Path(args.dump).write_text(sass)
    print(report(sass, args.top, args.loops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
