"""Every benchmark runs end to end on the bundled model at tiny sizes and writes valid JSON with its
fields (figures are not checked: speed is a benchmark's business, not a test's)."""

from __future__ import annotations

import json

import pytest

from server_harness import LiveServer


def run_bench(module: str, args: list[str], tmp_path) -> dict:
    import importlib

    out = tmp_path / f"{module}.json"
    importlib.import_module(f"sgjit.bench.{module}").main([*args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["benchmark"] == module and result["rows"]
    return result


def test_generate(tmp_path):
    r = run_bench("generate", ["--device", "cpu", "--repeat", "1", "--new-tokens", "4"], tmp_path)
    assert {row["engine"] for row in r["rows"]} == {"sgjit", "transformers"}
    assert r["ceilings"]["read_gbps"] > 0 and "decode_vs_transformers" in r["rows"][0]


def test_generate_reads_no_decode_rate_from_noise():
    """Decode rate = (N - 1) / (t_N - t_1); where a busy machine made the N-token run no slower than
    the 1-token one, there is no rate to report (it was printed as a negative one)."""
    import math

    from sgjit.bench.generate import row

    assert row("sgjit", 10, 5, 0.1, 0.5, 100.0)["decode_tok_s"] == pytest.approx(10.0)
    assert math.isnan(row("llama.cpp", 10, 5, 0.5, 0.4, 100.0)["decode_tok_s"])


def test_latency(tmp_path):
    r = run_bench(
        "latency",
        ["--smoke", "--device", "cpu", "--plot", str(tmp_path), "--profile", str(tmp_path)],
        tmp_path,
    )
    assert (tmp_path / "latency.png").stat().st_size > 1000
    assert json.loads((tmp_path / "latency-b1.trace.json").read_text())["traceEvents"]
    assert {row["engine"] for row in r["rows"]} == {"sgjit-jit", "sgjit", "transformers"}
    for key in ("prefill_ms", "decode_tok_s_per_seq", "decode_tok_s_total", "decode_roofline_tok_s_per_seq"):
        assert key in r["rows"][0]


def test_host_profile_on_the_cpu(tmp_path):
    """The engine thread's profile over multi-step launches (the bucketed path, eager on the CPU):
    the launch and completion methods are in it, and the host time per step is measured."""
    r = run_bench(
        "host_profile",
        ["--device", "cpu", "--batch-size", "2", "--input-len", "8", "--output-len", "9", "--top", "400"],
        tmp_path,
    )
    row = r["rows"][0]
    assert row["multi_step_launches"] >= 1 and row["host_us_per_step"] > 0
    phases = row["phases_us_per_launch"]
    assert phases["engine._launch_multi"] >= phases["graphs._load"] > 0 and phases["engine._complete"] > 0
    assert (
        "_launch_multi" in row["profile_by_cumulative_time"]
        and "_complete" in row["profile_by_cumulative_time"]
    )


def test_decode_kernels_on_the_cpu(tmp_path):
    """The profiled generation's trace is read by engine step: its decode launches are found (the
    step ranges tie the trace to the run) and the decode rate is measured. On the CPU there are no
    kernels to list (the GPU runs are in docs/performance.md)."""
    r = run_bench(
        "decode_kernels",
        ["--device", "cpu", "--batch-size", "2", "--input-len", "8", "--output-len", "9"],
        tmp_path,
    )
    row = r["rows"][0]
    assert row["decode_tok_s_per_seq"] > 0 and row["kernels"] == []
    kinds = {s["kind"]: s for s in row["steps"]}
    assert kinds.keys() & {"decode", "multi"} and kinds.get("prefill", {"count": 1})["count"] >= 1


def test_latency_host_time_on_the_cpu(tmp_path):
    """The bucketed decode path run eagerly on the CPU has multi-step launches, so the engine's host
    time per decode step and the output thread's time per token are measured there."""
    r = run_bench("latency", ["--smoke", "--device", "cpu", "--engines", "sgjit-bucketed"], tmp_path)
    for row in r["rows"]:
        assert row["host_us_per_step"] > 0 and row["output_us_per_token"] > 0


def test_throughput(tmp_path):
    row = run_bench("throughput", ["--smoke", "--device", "cpu"], tmp_path)["rows"][0]
    assert row["output_tokens"] > 0 and row["output_tok_s"] > 0 and row["single_request_decode_tok_s"] > 0


def test_program(tmp_path):
    r = run_bench(
        "program", ["--smoke", "--device", "cpu", "--workloads", "few_shot_select", "log_analysis"], tmp_path
    )
    assert len(r["rows"]) == 8 and all(row["programs_s"] > 0 for row in r["rows"])


def test_jit(tmp_path):
    row = run_bench("jit", ["--smoke", "--device", "cpu"], tmp_path)["rows"][0]
    assert row["fresh_process_disk_hit"] is True and row["cache_hit_us_p50"] > 0


def test_serving_against_a_live_server(runtime, tmp_path):
    server = LiveServer(runtime)
    try:
        row = run_bench("serving", ["--url", server.url, "--smoke"], tmp_path)["rows"][0]
    finally:
        server.stop()
    assert row["completed"] == row["requests"] == 8 and row["errors"] == 0
    assert row["ttft_p50_ms"] > 0 and row["output_tok_s"] > 0
    assert 0 < row["pct_of_roofline"] < 100  # the sgjit server's model sizes and this CPU's ceilings


def test_serving_sweep_and_workloads(runtime, tmp_path):
    """A request-rate sweep over the shared-prefix workload (one row a rate, curves drawn) and a
    ShareGPT-like run, shrunk to a few tokens."""
    server = LiveServer(runtime)
    try:
        sweep = run_bench(
            "serving",
            ["--url", server.url, "--smoke", "--workload", "shared-prefix", "--request-rate", "40", "inf",
             "--plot", str(tmp_path)],
            tmp_path,
        )  # fmt: skip
        sharegpt = run_bench(
            "serving",
            ["--url", server.url, "--smoke", "--workload", "sharegpt", "--plot", str(tmp_path)],
            tmp_path,
        )
    finally:
        server.stop()
    assert [row["request_rate"] for row in sweep["rows"]] == [40.0, float("inf")]
    for row in sweep["rows"] + sharegpt["rows"]:
        assert row["completed"] == row["requests"] == 8 and row["errors"] == 0
        assert row["output_tok_s"] > 0 and row["tpot_p50_ms"] > 0
    assert sweep["rows"][0]["mean_input_len"] == 64 + 16  # a system prompt and the request's own part
    # one chart a workload: a second sweep into the same folder does not overwrite the first
    assert (tmp_path / "serving-shared-prefix.png").stat().st_size > 1000
    assert (tmp_path / "serving-sharegpt.png").stat().st_size > 1000


@pytest.mark.gpu
def test_kernels(tmp_path):
    run_bench("kernels", ["--only", "elementwise"], tmp_path)


def test_soak(tmp_path):
    """A short soak of its own server: every request answered, greedy answers under load equal to
    the same requests alone, and every KV page free again afterwards."""
    r = run_bench("soak", ["--smoke"], tmp_path)
    row = r["rows"][0]
    assert r["errors"] == [] and row["errors"] == 0
    assert row["greedy_checked"] > 0 and row["greedy_mismatches"] == 0, r["mismatches"]
    assert row["leaked_pages"] == 0 and row["pages_end"] == row["pages_start"]
    assert r["samples"] and all(s["health_ok"] for s in r["samples"])
