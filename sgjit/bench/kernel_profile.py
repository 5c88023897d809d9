"""`python -m sgjit.bench.kernels --profile DIR`: a kernel trace of the attention kernels at the
Llama-3-8B shape (32 q / 8 kv heads, d=128, page 16): one decode step of 64 rows x 4096 keys on a
bf16 and on an fp8 pool, and one causal 4096-token prefill, as the selector builds them.

The workload (`python -m sgjit.bench.kernel_profile --workload DIR`) compiles and warms every case,
then runs them between cudaProfilerStart/Stop with an NVTX range per case, so the tools see only
that part: Nsight Compute (`ncu`) one launch of each decode and prefill kernel with the full section
set, Nsight Systems (when `nsys` is installed) a timeline of a few repeats. A short summary is read
back from the reports: time, DRAM GB/s, the case's own rate (K/V GB/s or TFLOP/s), tensor-pipe and
shared-memory utilisation, registers, occupancy, the leading warp stall reasons, and where they sit:
the SASS instructions with the most warp stall samples. A tool that is
missing, fails (no permission for the performance counters, say) or overruns its time limit is noted
in the summary; the rest still runs.

Files under DIR: workload.json (what each case moves or computes), kernels.nsys-rep and
nsys_kernels.csv (timeline, per-kernel totals), kernels.ncu-rep (open in ncu-ui) and ncu_raw.csv
(every metric of every launch), summary.txt and summary.json."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from sgjit.kernels.sass import opcode

log = logging.getLogger(__name__)

DEV = torch.device("cuda")
HQ, HKV, D, PAGE = 32, 8, 128, 16
DECODE_ROWS, DECODE_CTX, PREFILL_TOKENS = 64, 4096, 4096
NSYS_REPEATS = 5
NCU_TIMEOUT_S, NSYS_TIMEOUT_S = 60, 30  # a GPU session's command has minutes, not hours
NCU_KERNELS = "regex:stream_decode|attention"  # the decode and prefill kernels, not the merges
CASES = ("decode bf16", "decode fp8", "prefill bf16")  # what _cases() builds, in its order

# What the summary reads from ncu's raw page (Hopper / Ampere metric names); a metric a tool version
# lacks is left out.
NCU_METRICS = {
    "time_us": "gpu__time_duration.sum",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "dram_pct_peak": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct_peak": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_gmma_pct": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smem_pct": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
    "smem_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "regs": "launch__registers_per_thread",
    "occupancy_achieved_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "occupancy_theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "smem_per_block": "launch__shared_mem_per_block_dynamic",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
}
# Warp stall reasons (ncu's Warp State section): warps stalled for the reason per instruction issued,
# one metric a reason ("selected" is the issuing warp itself: 1 per issue).
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
TOP_STALLS = 6
# Where the stalls sit (ncu's source page, SASS, from the full set's SourceCounters section): each
# instruction's share of the warp stall samples.
SAMPLES_COLUMN = "Warp Stall Sampling (All Samples)"
HOT_INSTRUCTIONS, HOT_OPCODES = 6, 8
_SCALE = {
    "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,  # -> us
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,  # -> bytes
    "KB": 1024.0, "MB": 1024.0**2,
}  # fmt: skip


# ---- the workload the tools run ----------------------------------------------------------------------
def _cases() -> dict[str, tuple[Any, Any, dict[str, float]]]:
    """case -> (op, inputs, work): the ops the selector builds for the device, on synthetic inputs."""
    from sgjit.kernels.arch import device_profile
    from sgjit.kernels.cuda.attention import PagedAttention
    from sgjit.kernels.selector import KernelSelector
    from sgjit.kernels.spec import ModelShapes, Workload
    from sgjit.kernels.synthetic import paged_attention_case

    profile = device_profile(DEV)
    out = {}
    specs = (
        (CASES[0], "bfloat16", [1] * DECODE_ROWS, [DECODE_CTX] * DECODE_ROWS),
        (CASES[1], "fp8_e4m3", [1] * DECODE_ROWS, [DECODE_CTX] * DECODE_ROWS),
        (CASES[2], "bfloat16", [PREFILL_TOKENS], [PREFILL_TOKENS]),
    )
    for name, kv, q_lens, kv_lens in specs:
        shapes = ModelShapes("bfloat16", kv, 4096, 14336, HQ, HKV, D, D, 128256, PAGE)
        ctx = max(kv_lens)
        t = (
            KernelSelector()
            .select(profile, shapes, Workload(DECODE_ROWS, ctx, PREFILL_TOKENS))["attention"]
            .tunables
        )
        op = PagedAttention(
            profile,
            shapes,
            torch.bfloat16,
            t["decode_tile"],
            t["prefill_tile"],
            ctx,
            stream_tile=t["stream_decode"],
            prefill_sm90=t.get("prefill_sm90"),
        )
        kv_dtype = torch.float8_e4m3fn if kv == "fp8_e4m3" else torch.bfloat16
        case = paged_attention_case(
            q_lens, kv_lens, HQ, HKV, D, PAGE, torch.bfloat16, kv_dtype, DEV, kv_scale=0.5
        )
        if name.startswith("decode"):
            work = {"bytes": 2 * DECODE_ROWS * DECODE_CTX * HKV * D * shapes.kv_bytes}
        else:
            work = {"flops": 4 * PREFILL_TOKENS**2 * HQ * D / 2}  # causal: half the square
        out[name] = (op, case, work)
    return out


def run_workload(out_dir: Path, repeats: int, only: str | None = None) -> None:
    """Every case (or only the case `only`) `repeats` times inside the profiled range."""
    cases = _cases()
    scale = D**-0.5
    for op, case, _ in cases.values():  # compile, warm up, fill caches outside the profiled range
        for _ in range(2):
            op(case.q, case.kv, case.meta, scale)
    torch.cuda.synchronize()
    (out_dir / "workload.json").write_text(json.dumps({n: w for n, (_, _, w) in cases.items()}, indent=1))
    torch.cuda.profiler.start()
    for _ in range(repeats):
        for name, (op, case, _) in cases.items():
            if only is not None and name != only:
                continue
            torch.cuda.nvtx.range_push(name)
            op(case.q, case.kv, case.meta, scale)
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# ---- running the tools and reading their reports -----------------------------------------------------
def _tool(cmd: list[str], out_dir: Path, log_name: str, timeout: float) -> tuple[bool, str]:
    """Run a profiler command; (ok, the tail of its output), the whole output in DIR/<log_name>."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s: {' '.join(cmd)}"
    text = proc.stdout + proc.stderr
    (out_dir / log_name).write_text(text)
    return proc.returncode == 0, text[-1500:]


def _workload_cmd(out_dir: Path, repeats: int, only: str | None = None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "sgjit.bench.kernel_profile",
        "--workload",
        str(out_dir),
        "--repeats",
        str(repeats),
    ]
    return cmd + (["--case", only] if only else [])


def _nsys(out_dir: Path) -> dict[str, Any]:
    nsys = shutil.which("nsys")
    if nsys is None:
        return {"ok": False, "note": "nsys is not installed here: no timeline"}
    rep = out_dir / "kernels"
    ok, tail = _tool(
        [nsys, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--force-overwrite=true",
         "-o", str(rep), *_workload_cmd(out_dir, NSYS_REPEATS)],
        out_dir, "nsys.log", NSYS_TIMEOUT_S,
    )  # fmt: skip
    if not ok:
        return {"ok": False, "note": "nsys profile failed", "tail": tail}
    for report in ("cuda_gpu_kern_sum", "gpukernsum"):  # the report's name before nsys 2023.2
        done, text = _capture([nsys, "stats", "--report", report, "--format", "csv", f"{rep}.nsys-rep"])
        rows = _csv_rows(text, "Total Time")
        if done and rows:
            _write_csv(out_dir / "nsys_kernels.csv", rows)
            kernels = [
                {"name": _short(r.get("Name", "")), "total_us": float(r["Total Time (ns)"]) / 1e3,
                 "instances": int(r["Instances"]), "avg_us": float(r["Avg (ns)"]) / 1e3}
                for r in rows if "Total Time (ns)" in r
            ]  # fmt: skip
            return {"ok": True, "report": f"{rep}.nsys-rep", "kernels": kernels, "repeats": NSYS_REPEATS}
    return {"ok": False, "note": "nsys stats gave no kernel summary", "report": f"{rep}.nsys-rep"}


def _ncu(out_dir: Path) -> dict[str, Any]:
    """One ncu run a case, so each launch is told by the run it came from: the mma.sync kernel serves
    both decode and prefill, and a kernel's name cannot say which case launched it."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"ok": False, "note": "ncu is not installed here"}
    kernels, texts = [], []
    for case in CASES:
        rep = out_dir / f"kernels-{case.replace(' ', '-')}"
        ok, tail = _tool(
            [ncu, "--profile-from-start", "off", "--kernel-name", NCU_KERNELS, "--set", "full", "-f", "-o",
             str(rep), *_workload_cmd(out_dir, 1, case)],
            out_dir, f"ncu-{case.replace(' ', '-')}.log", NCU_TIMEOUT_S,
        )  # fmt: skip
        if not ok:
            return {
                "ok": False,
                "note": f"ncu failed on {case} (ERR_NVGPUCTRPERM means no access to the counters)",
                "tail": tail,
            }
        done, text = _capture([ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw"])
        rows = _csv_rows(text, '"ID"', units_row=True)
        if not done or not rows:
            return {"ok": False, "note": f"ncu --import gave no rows for {case}", "report": f"{rep}.ncu-rep"}
        texts.append(text)
        work = json.loads((out_dir / "workload.json").read_text())  # written by the workload run
        found = [_ncu_kernel(r, case, work.get(case, {})) for r in rows]
        if len(found) == 1:  # the source page of a report of one launch: where its stalls sit
            done, src = _capture(
                [ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "source", "--print-source", "sass"]
            )
            if done and (hot := source_hotspots(src)):
                found[0]["hot"] = hot
        kernels += found
    (out_dir / "ncu_raw.csv").write_text("\n".join(texts))
    return {"ok": True, "report": str(out_dir / "kernels-<case>.ncu-rep"), "kernels": kernels}


def _ncu_kernel(row: dict[str, tuple[str, str]], case: str, work: dict[str, float]) -> dict[str, Any]:
    """One launch's figures, and its case's own rate (the main kernel's, not a merge's)."""
    name = row.get("Kernel Name", ("", ""))[0]
    k: dict[str, Any] = {"name": _short(name), "case": case}
    for key, metric in NCU_METRICS.items():
        if metric in row:
            value, unit = row[metric]
            try:
                k[key] = float(value.replace(",", "")) * _SCALE.get(unit, 1.0)
            except ValueError:
                k[key] = value
            if unit and unit not in _SCALE:  # a unit this table does not convert stays beside its value
                k[f"{key}_unit"] = unit
    stalls = {}
    for metric, (value, _) in row.items():
        if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX):
            try:
                stalls[metric[len(STALL_PREFIX) : -len(STALL_SUFFIX)]] = float(value.replace(",", ""))
            except ValueError:
                continue
    k["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:TOP_STALLS])
    t = k.get("time_us")
    if t and "dram_read" in k:
        k["dram_gbps"] = (k["dram_read"] + k.get("dram_write", 0.0)) / t / 1e3
    if t and "merge" not in name:
        if "bytes" in work:
            k["kv_gbps"] = work["bytes"] / t / 1e3
        if "flops" in work:
            k["tflops"] = work["flops"] / t / 1e6
    return k


def source_hotspots(text: str) -> dict[str, Any]:
    """From `ncu --import R --csv --page source --print-source sass` of one launch: the share (%) of
    its warp stall samples by opcode, and the instructions holding the most, largest first."""
    rows = _csv_rows(text, f'"{SAMPLES_COLUMN}"')
    samples = []
    for r in rows:
        sass = (r.get("Source") or "").strip()
        try:
            n = float((r.get(SAMPLES_COLUMN) or "").replace(",", ""))
        except ValueError:
            continue
        if sass and n > 0:
            samples.append((n, r.get("Address", ""), sass))
    total = sum(n for n, _, _ in samples)
    if not total:
        return {}
    by_op: dict[str, float] = {}
    for n, _, sass in samples:
        op = opcode(sass)
        by_op[op] = by_op.get(op, 0.0) + 100 * n / total
    top = sorted(samples, key=lambda x: -x[0])[:HOT_INSTRUCTIONS]
    return {
        "samples": total,
        "by_opcode": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:HOT_OPCODES]),
        "top": [{"pct": 100 * n / total, "address": a, "sass": sass} for n, a, sass in top],
    }


def _capture(cmd: list[str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NSYS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, ""
    return proc.returncode == 0, proc.stdout


def _csv_rows(text: str, marker: str, units_row: bool = False) -> list[dict]:
    """The CSV table in a tool's output, from its header (the first line holding `marker`); with
    `units_row`, each value paired with its column's unit (ncu's raw page puts a row of units, its
    first cell empty, under the header)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if marker in ln), None)
    if start is None:
        return []
    table = [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]
    head, body = table[0], table[1:]
    if not units_row:
        return [dict(zip(head, r)) for r in body]
    units = [""] * len(head)
    if body and body[0] and body[0][0] == "":
        units, body = body[0], body[1:]
    return [{h: (v, u) for h, v, u in zip(head, r, units)} for r in body]


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _short(name: str) -> str:
    """A kernel's name without its return type and parameter list."""
    return name.split("(")[0].strip().removeprefix("void ")


def _fmt(v: Any, digits: int = 0) -> str:
    return "" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def summary_text(result: dict[str, Any]) -> str:
    lines = [f"kernel trace under {result['dir']} ({result['gpu']})"]
    ncu = result["ncu"]
    if ncu["ok"]:
        lines.append(
            "ncu: case | kernel | us | DRAM GB/s (% peak) | K/V GB/s or TFLOP/s | tensor % | issue % | smem % | "
            "regs | occupancy achieved/theoretical % | grid x block, smem/block"
        )
        for k in ncu["kernels"]:
            rate = (
                _fmt(k.get("kv_gbps")) + " GB/s" if "kv_gbps" in k else _fmt(k.get("tflops"), 1) + " TFLOP/s"
            )
            tensor = k.get("tensor_pct") or k.get("tensor_gmma_pct")
            lines.append(
                f"  {k.get('case', '-')} | {k['name'][:80]} | {_fmt(k.get('time_us'), 1)} | "
                f"{_fmt(k.get('dram_gbps'))} ({_fmt(k.get('dram_pct_peak'))}) | {rate} | {_fmt(tensor, 1)} | {_fmt(k.get('issue_pct'), 1)} | "
                f"{_fmt(k.get('smem_pct'), 1)} | {_fmt(k.get('regs'))} | {_fmt(k.get('occupancy_achieved_pct'), 1)}"
                f"/{_fmt(k.get('occupancy_theoretical_pct'), 1)} | {_fmt(k.get('grid'))} x {_fmt(k.get('block'))}, "
                f"{_fmt(k.get('smem_per_block'))} {k.get('smem_per_block_unit', 'B')}"
            )
            if k.get("stalls"):
                lines.append(
                    "      stalls (warps a issued instruction): "
                    + ", ".join(f"{reason} {v:.2f}" for reason, v in k["stalls"].items())
                )
            if hot := k.get("hot"):
                lines.append(
                    "      stall samples by opcode: "
                    + ", ".join(f"{op} {pct:.1f}%" for op, pct in hot["by_opcode"].items())
                )
                lines += [f"        {h['pct']:5.1f}%  {h['address']}  {h['sass'][:90]}" for h in hot["top"]]
    else:
        lines.append(f"ncu: {ncu['note']}" + (f"\n{ncu['tail']}" if ncu.get("tail") else ""))
    nsys = result["nsys"]
    if nsys["ok"]:
        lines.append(f"nsys ({nsys['repeats']} repeats of the cases): kernel | instances | avg us | total us")
        for k in sorted(nsys["kernels"], key=lambda k: -k["total_us"])[:10]:
            lines.append(f"  {k['name'][:70]} | {k['instances']} | {k['avg_us']:.1f} | {k['total_us']:.1f}")
    else:
        lines.append(f"nsys: {nsys['note']}" + (f"\n{nsys['tail']}" if nsys.get("tail") else ""))
    return "\n".join(lines)


def profile(out_dir: str | Path) -> dict[str, Any]:
    """Both tools over the workload; the summary is printed and written under `out_dir`."""
    d = Path(out_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    ncu = _ncu(d)  # first: the more telling of the two, should time run short
    result = {"dir": str(d), "gpu": torch.cuda.get_device_name(DEV), "nsys": _nsys(d), "ncu": ncu}
    text = summary_text(result)
    (d / "summary.txt").write_text(text + "\n")
    (d / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    print(text)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m sgjit.bench.kernel_profile", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--workload", metavar="DIR", help="run the profiled cases (what the tools launch)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--case", choices=CASES, help="with --workload: only this case in the profiled range")
    ap.add_argument("--profile", metavar="DIR", help="run nsys and ncu over the workload, summarise into DIR")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if not torch.cuda.is_available():
        raise SystemExit("python -m sgjit.bench.kernel_profile needs a CUDA GPU")
    if args.workload:
        run_workload(Path(args.workload), args.repeats, args.case)
    elif args.profile:
        profile(args.profile)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
