"""`python -m sgjit.bench.megakernel_trace`: where the decode megakernel's step goes, phase by phase.

Builds a model of --model-shape with random weights and the selector's kernels (the megakernel
offered as under SGJIT_UNVERIFIED_KERNELS=1), a pool of random keys and values, and one decode step
of --rows rows over --context keys each. It times that step (eager launches back to back, CUDA
events), then runs a build of the kernel compiled with SGJIT_MEGA_TRACE, whose CTAs stamp the GPU's
globaltimer at each grid barrier, and prints per phase kind (median over layers and launches):
- work: from the previous barrier's release (as CTA 0 saw it) to the last CTA's arrival;
- spread: from the first CTA's arrival to the last's (CTAs with little or no work arrive first);
- release: from the last arrival to CTA 0 seeing the barrier open (the barrier's own latency, plus
  whatever CTA 0 issues between arriving and waiting);
- cta_wait, cta_input, cta_rest: one CTA's own phase (MEGA_TRACE_CTA, 1: it has work in every phase),
  from its previous arrival to its seeing the release, from there to its input ready (a GEMV phase's
  prologue: the rmsnorm, the attention merge), and from there to its arrival (streaming, reduction,
  epilogue).

The stamps cost a few atomics a barrier: read the phases from the trace, the step's time from the
untraced launch. Needs a GPU with CuPy."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

import numpy as np

PHASES = ("qkv", "attention", "o_proj", "gate_up", "down")
SLOTS = 1024  # megakernel.cu's MEGA_TRACE_SLOTS
COLUMNS = ("work", "spread", "release", "cta_wait", "cta_input", "cta_rest")


def _decode_step(shape: str, rows: int, context: int):
    """(the megakernel op, its arguments for one decode step, the model's layer count)."""
    import torch

    from sgjit.kernels.ops import AttentionMetadata
    from sgjit.runtime.kv_pool import PagedKVPool
    from sgjit.runtime.model.llama import LlamaModel
    from sgjit.runtime.model.presets import random_weights, shape_config

    os.environ["SGJIT_UNVERIFIED_KERNELS"] = "1"
    from sgjit.kernels.arch import device_profile
    from sgjit.kernels.selector import KernelSelector
    from sgjit.kernels.spec import ModelShapes, Workload
    from sgjit.kernels.table import build_ops

    dev, page = torch.device("cuda"), 16
    cfg = shape_config(shape)
    profile = device_profile(dev)
    shapes = ModelShapes.from_config(cfg, torch.bfloat16, torch.bfloat16, page)
    ops = build_ops(profile, shapes, KernelSelector().select(profile, shapes, Workload(rows, 4096)))
    if ops.decode_megakernel is None:
        raise SystemExit(f"the selector gives {shape} no megakernel at {rows} rows")
    model = LlamaModel(cfg, random_weights(cfg, seed=0, device=dev, dtype=torch.bfloat16), ops, dev,
                       torch.bfloat16, max_positions=context + 1)  # fmt: skip
    per_row = -(-context // page)
    pool = PagedKVPool(
        cfg.num_layers, rows * per_row + 1, page, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, dev
    )
    for t in (pool.k, pool.v):
        t.normal_(0, 1)
    pages = [list(range(1 + r, 1 + rows * per_row, rows)) for r in range(rows)]  # interleaved rows
    last = context - 1
    meta = AttentionMetadata(
        qo_indptr=torch.arange(rows + 1, dtype=torch.int32, device=dev),
        kv_lens=torch.full((rows,), context, dtype=torch.int32, device=dev),
        page_table=torch.tensor(pages, dtype=torch.int32, device=dev), page_size=page, max_q_len=1,
        max_kv_len=context, qo_indptr_host=list(range(rows + 1)), kv_lens_host=[context] * rows,
    )  # fmt: skip
    args = (
        model.decode_weights, torch.randint(0, cfg.vocab_size, (rows,), device=dev),
        torch.full((rows,), last, dtype=torch.int64, device=dev),
        torch.tensor([p[last // page] * page + last % page for p in pages], dtype=torch.int64, device=dev),
        pool.layers, meta,
    )  # fmt: skip
    return ops.decode_megakernel, args, shapes, profile, cfg.num_layers


def _step_us(op, args, repeats: int = 300) -> float:
    import torch

    for _ in range(20):
        op(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        op(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def _traces(shapes, profile, rows: int, args, launches: int) -> list[np.ndarray]:
    """The stamps of `launches` traced launches (the first two, warming, left out)."""
    import cupy
    import torch

    from sgjit.kernels.cuda.gemv import bucket
    from sgjit.kernels.cuda.megakernel import DecodeMegakernel, megakernel_name
    from sgjit.kernels.cuda.module import compiled_module

    defines = ("SGJIT_MEGA_TRACE=1",)
    traced = DecodeMegakernel(profile, shapes, rows, defines)
    name = megakernel_name(shapes.dtype, bucket(rows), shapes.head_dim, shapes.group)
    module = compiled_module("megakernel", name, defines)
    trace = cupy.ndarray((SLOTS, 3), dtype=cupy.uint64, memptr=module.get_global("mega_trace"))
    cta = cupy.ndarray((SLOTS, 3), dtype=cupy.uint64, memptr=module.get_global("mega_cta_trace"))
    out = []
    for i in range(launches + 2):
        trace[:, 0] = np.iinfo(np.uint64).max
        trace[:, 1:] = 0
        cta[:] = 0
        torch.cuda.synchronize()
        traced(*args)
        torch.cuda.synchronize()
        if i >= 2:
            out.append(np.concatenate([cupy.asnumpy(trace), cupy.asnumpy(cta)], axis=1).astype(np.int64))
    return out


def summarize(traces: list[np.ndarray], layers: int) -> dict[str, Any]:
    """Median µs per phase kind of the stamps (see the module doc)."""
    names = ["embed"] + [p for _ in range(layers) for p in PHASES]
    got: dict[str, list[tuple[float, ...]]] = {}
    totals = []
    for t in traces:
        start, end = t[SLOTS - 1, 0], t[SLOTS - 1, 1]
        prev = start
        for i, name in enumerate(names):
            first, last, release = t[i, :3]
            row = [last - prev, last - first, release - last, 0.0, 0.0, 0.0]
            # the traced CTA's phase: barrier i - 1's arrival, release seen, input ready; i's arrival
            if i > 0:
                arrived, seen, ready = t[i - 1, 3:]
                ready = ready or seen  # a phase with no prologue
                row[3:] = [seen - arrived, ready - seen, t[i, 3] - ready]
            got.setdefault(name, []).append(tuple(row))
            prev = release
        got.setdefault("lm_head", []).append((end - prev, 0, 0, 0, 0, 0))
        totals.append(end - start)
    phases = {
        name: {k: statistics.median(v[j] for v in vals) / 1e3 for j, k in enumerate(COLUMNS)}
        for name, vals in got.items()
    }
    per_layer = sum(phases[p]["work"] + phases[p]["release"] for p in PHASES)
    return {"phases_us": phases, "layer_us": per_layer, "traced_step_us": statistics.median(totals) / 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-shape", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--context", type=int, default=160, help="keys a row attends over (this step's included)")
    p.add_argument("--launches", type=int, default=10)
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = p.parse_args()
    op, step, shapes, profile, layers = _decode_step(args.model_shape, args.rows, args.context)
    res = {"model_shape": args.model_shape, "rows": args.rows, "context": args.context,
           "step_us": _step_us(op, step)}  # fmt: skip
    res |= summarize(_traces(shapes, profile, args.rows, step, args.launches), layers)
    print(f"step {res['step_us']:.1f} us ({1e6 / res['step_us']:.0f} steps/s); traced {res['traced_step_us']:.1f} us, "
          f"{res['layer_us']:.2f} us a layer")  # fmt: skip
    print(f"{'phase':10s}" + "".join(f" {k:>9s}" for k in COLUMNS) + "  (us, median)")
    for name, ph in res["phases_us"].items():
        print(f"{name:10s}" + "".join(f" {ph[k]:9.2f}" for k in COLUMNS))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
