"""`python -m sgjit.kernels.nvcc_check --check`: compile every registered kernel instantiation with the
machine's nvcc for sm_80 and sm_90 (the Hopper-only family for sm_90a alone), so a template that no
longer compiles fails CI without a GPU.
Exit status 1 names each instantiation that failed; `--resources` prints ptxas's registers, spills
and shared memory per kernel (the first thing to read when a kernel is slow). `--quick` (what CI's
build test runs) builds without optimization: the front end still instantiates every template and
ptxas still assembles every instruction for every target, in about a third of the time of the
optimized build (which the register tests in tests/kernels/test_kernels_build.py keep for the
kernels whose register budget is a contract)."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sgjit.kernels.cuda.activation import silu_mul_name
from sgjit.kernels.cuda.attention import attention_name, merge_name
from sgjit.kernels.cuda.attention_sm90 import attention_sm90_name
from sgjit.kernels.cuda.decode import stream_decode_name, stream_merge_name
from sgjit.kernels.cuda.fp8_quant import quantize_rows_name
from sgjit.kernels.cuda.fused_gemv import KERNELS as FUSED_KERNELS
from sgjit.kernels.cuda.fused_gemv import ROPE, fused_name
from sgjit.kernels.cuda.gemv import MMA_TILES, ROW_BUCKETS, TILES, gemv_name, tile_of
from sgjit.kernels.cuda.lean_decode import lean_decode_name
from sgjit.kernels.cuda.megakernel import megakernel_name
from sgjit.kernels.cuda.norm import norm_name
from sgjit.kernels.cuda.rope import rope_name
from sgjit.kernels.cuda.sampling import SAMPLING_NAMES
from sgjit.kernels.registry import (
    CUDA,
    HALF_DTYPES,
    MEGAKERNEL_ROW_CHOICES,
    SM90_SCHEDULE_PREFERENCE,
    StreamTile,
    variant,
)
from sgjit.kernels.selector import FUSED_ROWS, FUSED_ROWS_SMALL_LAYERS
from sgjit.kernels.sources import family_source
from sgjit.kernels.spec import ModelShapes

ARCHS = ("sm_80", "sm_90")
# Families whose code exists for one arch-specific target only (warpgroup MMAs: sm_90a).
FAMILY_ARCHS = {"attention_sm90": ("sm_90a",)}
# Families ptxas cannot build unoptimized (attention_sm90's setmaxnreg warpgroups crash ptxas at -O0):
# --quick builds them optimized.
NEEDS_OPTIMIZER = frozenset({"attention_sm90"})
# (head_dim, query heads per KV head) and hidden widths instantiated by default: those of the dense
# model presets (tests/kernels/test_kernels_build.py keeps this in step with
# sgjit.runtime.model.presets; the MoE presets' groups, 1 and 8, are in --full's groups 1..8).
HEAD_DIM_GROUPS = ((64, 3), (128, 4), (128, 7))
HIDDEN_WIDTHS = (64, 128, 576, 3584, 4096)


def _shapes(dtype: str, kv: str, head_dim: int, group: int, page: int) -> ModelShapes:
    return ModelShapes(dtype, kv, 0, 0, group * 2, 2, head_dim, head_dim, 0, page)


def instantiations(full: bool = False) -> dict[str, list[str]]:
    """family -> name expressions. The default set: every dtype x KV dtype x (head_dim, group) of the
    recorded model shapes at the preferred tiles, and every tile once; `full` adds the whole
    product with groups 1..8 and page sizes 16/32/64 (the set the GPU tests draw from), and the fused
    GEMVs at every row bucket (by default: 1 row and the selector's fused rows)."""
    dtypes = sorted(HALF_DTYPES)
    kvs = ("same", "fp8_e4m3")
    dims_groups = list(HEAD_DIM_GROUPS)
    tiles = variant("attention", CUDA).tunables
    decode, prefill = tiles["decode_tile"], tiles["prefill_tile"]
    pages = (16,)
    if full:
        dims_groups = [(d, g) for d in (64, 128) for g in range(1, 9)]
        pages = (16, 32, 64)
    attn = set()
    for dt, kv, (d, g), page in itertools.product(dtypes, kvs, dims_groups, pages):
        shapes = _shapes(dt, dt if kv == "same" else kv, d, g, page)
        chosen = (decode + prefill) if full else (decode[0], prefill[0])
        attn |= {attention_name(shapes, t) for t in chosen}
        attn.add(merge_name(shapes))
    base = _shapes("bfloat16", "bfloat16", 128, 4, 16)
    attn |= {attention_name(base, t) for t in decode + prefill}
    stream = _stream_instantiations(dtypes, kvs, dims_groups, full)
    sm90_tiles = tiles["prefill_sm90"]
    sm90 = {attention_sm90_name(base, t) for t in sm90_tiles}
    # every registered tile at the base shape; by default, at the other shapes, the preferred geometry
    # of each schedule the selector can pick (what serves), not of those kept for the benchmark
    sm90_firsts = [next(t for t in sm90_tiles if t.schedule == s) for s in SM90_SCHEDULE_PREFERENCE]
    for dt, (d, g), page in itertools.product(dtypes, dims_groups, pages):
        shapes = _shapes(dt, dt, d, g, page)
        sm90 |= {attention_sm90_name(shapes, t) for t in (sm90_tiles if full else sm90_firsts)}
    widths = HIDDEN_WIDTHS
    fused_buckets = ROW_BUCKETS if full else sorted({1, FUSED_ROWS, FUSED_ROWS_SMALL_LAYERS})
    kv_pairs = [(dt, dt) for dt in dtypes] + [(dt, "fp8_e4m3") for dt in dtypes]
    return {
        "norm": sorted({norm_name(dt, w, add) for dt in dtypes for w in widths for add in (False, True)}),
        "activation": [silu_mul_name(dt) for dt in dtypes],
        "rope": sorted({rope_name(dt, kv, d, d) for dt, kv in kv_pairs for d in (64, 128)}),
        "attention": sorted(attn),
        "decode": sorted(stream),
        "lean_decode": sorted(_lean_instantiations(dtypes, kvs, dims_groups, full)),
        "attention_sm90": sorted(sm90),
        "sampling": list(SAMPLING_NAMES),
        "gemv": sorted(
            {
                gemv_name(dt, w, b, *tile_of(b, w, tiles))
                for dt in dtypes
                for w in (dt, "fp8_e4m3")
                for b in ROW_BUCKETS
                for tiles in (None, TILES)
            }
            | {
                fused_name(kernel, dt, w, b, kv, tiles)
                for kernel in FUSED_KERNELS
                for dt, kv in kv_pairs
                for w in (dt, "fp8_e4m3")
                for b in fused_buckets
                for tiles in (None, TILES, MMA_TILES)
                if kernel == ROPE or kv == dt
            }
            | {gemv_name(dt, dt, b, *MMA_TILES[b]) for dt in dtypes for b in ROW_BUCKETS}
        ),
        "fp8_quant": [quantize_rows_name(dt) for dt in dtypes],
        # every rows bucket at SmolLM2's heads (the model it is for), the other recorded heads at 1 row
        "megakernel": sorted(
            {megakernel_name(dt, b, 64, 3) for dt in dtypes for b in MEGAKERNEL_ROW_CHOICES}
            | {megakernel_name(dt, 1, d, g) for dt in dtypes for d, g in dims_groups}
        ),
    }


def _stream_instantiations(
    dtypes: list[str], kvs: tuple[str, ...], dims_groups: list[tuple[int, int]], full: bool
) -> set[str]:
    """decode.cu: every dtype x KV dtype x (head_dim, group) at a 2-head, 4-stage tile and its merge;
    the Llama-3-8B shape (8 kv heads) at every ring depth of 8, 4 and 1 heads, bf16 and fp8; `full`
    adds groups 12 and 16 and pages below and above the 16-key tile."""
    pages = (4, 16, 64) if full else (16,)
    groups = dims_groups + ([(d, g) for d in (64, 128) for g in (12, 16)] if full else [])
    out = set()
    for dt, kv, (d, g), page in itertools.product(dtypes, kvs, groups, pages):
        shapes = ModelShapes(dt, dt if kv == "same" else kv, 0, 0, g * 2, 2, d, d, 0, page)
        out |= {stream_decode_name(shapes, StreamTile(2, 4)), stream_merge_name(shapes)}
    for kv in ("bfloat16", "fp8_e4m3"):
        llama = ModelShapes("bfloat16", kv, 0, 0, 32, 8, 128, 128, 0, 16)
        out |= {stream_decode_name(llama, StreamTile(h, s)) for h in (8, 4, 1) for s in (2, 3, 4, 6)}
    return out


def _lean_instantiations(
    dtypes: list[str], kvs: tuple[str, ...], dims_groups: list[tuple[int, int]], full: bool
) -> set[str]:
    """lean_decode.cu: every dtype x KV dtype x (head_dim, group) at page 16 without a cluster; in
    bf16, a cluster of 8 (sm_90's merge; below sm_90 it builds as a trap) and the largest groups (whose
    warps' merge buffers bound the CTA's shared memory); `full` adds clusters of 2 and 4, groups 12 and
    16 to the whole product, and one-key and 64-key pages."""
    pages = (1, 16, 64) if full else (16,)
    wide = [(d, g) for d in (64, 128) for g in (12, 16)]
    groups = dims_groups + (wide if full else [])

    def name(dt: str, kv: str, d: int, g: int, page: int, cluster: int = 1) -> str:
        shapes = ModelShapes(dt, dt if kv == "same" else kv, 0, 0, g * 2, 2, d, d, 0, page)
        return lean_decode_name(shapes, cluster=cluster)

    clusters = (2, 4, 8) if full else (8,)
    out = {name(dt, kv, d, g, page) for dt, kv, (d, g), page in itertools.product(dtypes, kvs, groups, pages)}
    out |= {name("bfloat16", kv, d, g, 16, cl) for kv in kvs for d, g in dims_groups for cl in clusters}
    return out | {name("bfloat16", "same", d, g, 16) for d, g in wide}


@dataclass(slots=True)
class Result:
    family: str
    arch: str
    names: list[str]
    ok: bool
    log: str
    seconds: float


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc")):
        if cand and Path(cand).exists():
            return cand
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    path = Path(home) / "bin" / "nvcc"
    return str(path) if path.exists() else None


def compile_unit(
    nvcc: str,
    family: str,
    names: list[str],
    arch: str,
    resources: bool,
    defines: tuple[str, ...] = (),
    optimize: bool = True,
) -> Result:
    """One nvcc run over a family's source with each name expression instantiated (taking a
    kernel's address makes nvcc emit it, as NVRTC's name expressions do); `defines` are NAME=VALUE
    macros, as compile_kernels takes them."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        proc = build_cubin(
            nvcc, family, names, arch, Path(tmp) / f"{family}.cubin", resources, defines, optimize
        )
    return Result(
        family, arch, names, proc.returncode == 0, proc.stdout + proc.stderr, time.perf_counter() - t0
    )


def build_cubin(
    nvcc: str, family: str, names: list[str], arch: str, cubin: Path, resources: bool = False,
    defines: tuple[str, ...] = (), optimize: bool = True,
) -> subprocess.CompletedProcess:  # fmt: skip
    """nvcc over the family's source (written beside `cubin`) with each name instantiated, into `cubin`."""
    refs = "\n".join(f"static void* const sgjit_inst_{i} = (void*)&{n};" for i, n in enumerate(names))
    src = cubin.with_suffix(".cu")
    src.write_text(family_source(family) + "\n" + refs + "\n")
    cmd = [nvcc, "-std=c++17", f"-arch={arch}", "-cubin", "-diag-suppress", "177", "-o", str(cubin), str(src)]  # fmt: skip
    if resources:
        cmd.insert(1, "-Xptxas=-v")
    if not optimize:  # every template and PTX instruction still checked; register figures meaningless
        cmd[1:1] = ["-Xcicc", "-O0", "-Xptxas", "-O0"]
    cmd[1:1] = [f"-D{d}" for d in defines]
    return subprocess.run(cmd, capture_output=True, text=True)


def resource_lines(log: str) -> list[str]:
    """ptxas -v output as one line per kernel: registers, spills, shared memory."""
    lines, name = [], None
    spill = ""
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            name = m.group(1)
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spill = f"spill {m.group(1)}/{m.group(2)} B"
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            smem = re.search(r"(\d+) bytes smem", line)
            lines.append(
                f"  {m.group(1):>3} regs  {spill:<18} {smem.group(1) if smem else 0:>6} B smem  {name}"
            )
            name, spill = None, ""
    return lines


def check(
    archs: tuple[str, ...],
    full: bool,
    jobs: int,
    resources: bool,
    extra: list[str],
    families: list[str] | None,
    optimize: bool = True,
) -> int:
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found (set NVCC or CUDA_HOME)", file=sys.stderr)
        return 2
    units = {f: names for f, names in instantiations(full).items() if not families or f in families}
    for item in extra:
        family, _, name = item.partition(":")
        units.setdefault(family, []).append(name)
    todo = [(f, names, a) for f, names in units.items() for a in FAMILY_ARCHS.get(f, archs)]
    todo.sort(key=lambda t: -len(family_source(t[0])))  # the longest builds first, not last on one worker

    def build(family: str, names: list[str], arch: str, resources: bool) -> Result:
        opt = optimize or family in NEEDS_OPTIMIZER
        return compile_unit(nvcc, family, names, arch, resources, optimize=opt)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        results = list(pool.map(lambda t: build(*t, resources), todo))
        # A family that failed is recompiled one instantiation at a time to name the culprits.
        retry = [(r.family, [n], r.arch) for r in results if not r.ok and len(r.names) > 1 for n in r.names]
        singles = list(pool.map(lambda t: build(*t, False), retry))
    failed = [r for r in results if not r.ok and len(r.names) == 1] + [r for r in singles if not r.ok]
    for r in results:
        status = "ok" if r.ok else "FAILED"
        print(f"{r.family:<11} {r.arch}  {len(r.names):>3} instantiations  {r.seconds:5.1f} s  {status}")
        if resources and r.ok:
            print("\n".join(resource_lines(r.log)))
    for r in failed:
        errors = [ln for ln in r.log.splitlines() if "error" in ln.lower()][:5]
        print(f"FAILED {r.family}.cu {r.arch}: {r.names[0]}\n  " + "\n  ".join(errors), file=sys.stderr)
    if any(not r.ok for r in results) and not failed:  # a family failing as a whole only
        print("FAILED: " + ", ".join(f"{r.family}.cu {r.arch}" for r in results if not r.ok), file=sys.stderr)
        return 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sgjit.kernels.nvcc_check", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--check", action="store_true", help="compile every registered instantiation")
    ap.add_argument("--arch", nargs="+", default=list(ARCHS), help="targets (default sm_80 sm_90)")
    ap.add_argument("--full", action="store_true", help="the whole dtype x head_dim x group x page product")
    ap.add_argument("--resources", action="store_true", help="print registers / spills / smem per kernel")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--families", nargs="+", help="only these families (default all)")
    ap.add_argument("--extra", action="append", default=[], help="family:name_expression to add")
    ap.add_argument(
        "--quick", action="store_true",
        help="build without optimization (-Xcicc -O0 -Xptxas -O0): every template is instantiated and every "
        "PTX instruction assembled, in about a third of the time; --resources then means nothing",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 2
    if args.quick and args.resources:
        ap.error("--resources needs the optimized build (drop --quick)")
    return check(
        tuple(args.arch), args.full, args.jobs, args.resources, args.extra, args.families, not args.quick
    )


if __name__ == "__main__":
    sys.exit(main())
