"""`--plot DIR`: PNG charts of a benchmark result (matplotlib, an optional dependency: `pip install
sgjit[plot]`): decode speed vs roofline per engine (latency), latency percentiles (serving), kernel
time vs roofline (kernels), programs/s per configuration (program), throughput vs concurrency, and
for a serving sweep throughput / TTFT / TPOT against the request rate."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _bars(
    ax, labels: list[str], values: list[float], title: str, ylabel: str, ceiling: list[float] | None = None
):
    xs = range(len(labels))
    ax.bar(xs, values, color="#4472c4", label="measured")
    if ceiling is not None:
        ax.scatter(xs, ceiling, marker="_", s=900, color="#c00000", label="roofline", zorder=3)
        ax.legend()
    ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)


def _serving_curves(plt, rows: list[dict[str, Any]]):
    """A request-rate sweep: output tok/s, TTFT and TPOT (p50 and p99) against the offered rate."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    labels = ["inf" if r["request_rate"] == float("inf") else f"{r['request_rate']:g}" for r in rows]
    xs = list(range(len(rows)))
    panels = [("output tok/s", ["output_tok_s"]), ("TTFT ms", ["ttft_p50_ms", "ttft_p99_ms"]),
              ("TPOT ms", ["tpot_p50_ms", "tpot_p99_ms"])]  # fmt: skip
    for ax, (title, keys) in zip(axes, panels):
        for key in keys:
            ax.plot(xs, [r.get(key) for r in rows], marker="o", label=key)
        ax.set_xticks(xs, labels)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"serving sweep, {rows[0].get('workload', '')} workload")
    return fig


def plot_result(result: dict[str, Any], out_dir: str | Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("--plot needs matplotlib: pip install 'sgjit[plot]'")
        return None
    rows, name = result["rows"], result["benchmark"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if name in ("latency", "generate"):
        per_seq = "decode_tok_s_per_seq" if name == "latency" else "decode_tok_s"
        roof = "decode_roofline_tok_s_per_seq" if name == "latency" else "decode_roofline_tok_s"
        labels = [f"{r['engine']} b{r.get('batch', 1)}" for r in rows]
        _bars(ax, labels, [r[per_seq] for r in rows], f"decode speed vs roofline ({result.get('model')})",
              "tok/s per sequence", [r[roof] for r in rows])  # fmt: skip
        ax.set_yscale("log")
    elif name == "serving" and len(rows) > 1:
        plt.close(fig)
        fig = _serving_curves(plt, rows)
    elif name == "serving":
        r = rows[0]
        keys = [k for k in r if k.endswith("_ms") and k.split("_")[0] in ("ttft", "tpot", "itl", "e2e")]
        _bars(
            ax, keys, [r[k] for k in keys], f"latency percentiles ({r['max_concurrency']} concurrent)", "ms"
        )
        ax.set_yscale("log")
    elif name == "kernels":
        labels = [str(r.get("kernel", r.get("name", i))) for i, r in enumerate(rows)]
        ours = [float(r.get("ours_us") or 0) for r in rows]
        torch_us = [float(r.get("torch_us") or 0) for r in rows]
        _bars(ax, labels, ours, "kernel time (bars) vs the torch equivalent (marks)", "µs", torch_us)
    elif name == "program":
        labels = [f"{r['workload']} jit={int(r['jit'])} cache={int(r['prefix_cache'])}" for r in rows]
        _bars(ax, labels, [r["programs_s"] for r in rows], "programs/s", "programs/s")
    elif name == "throughput":
        xs = [r["max_concurrency"] for r in rows]
        ax.plot(xs, [r["output_tok_s"] for r in rows], marker="o", label="output tok/s")
        ax.plot(
            xs, [r["decode_roofline_tok_s_at_concurrency"] for r in rows], linestyle="--", label="roofline"
        )
        ax.set_xlabel("concurrency")
        ax.set_ylabel("tok/s")
        ax.legend()
        ax.set_title("throughput vs concurrency")
    else:
        plt.close(fig)
        return None
    fig.tight_layout()
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    workload = rows[0].get("workload") if name == "serving" else None
    out = path / (
        f"{name}-{workload}.png" if workload else f"{name}.png"
    )  # sweeps of two workloads: two charts
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
