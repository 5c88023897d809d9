"""Units of the benchmarks: bench.trace_summary on a hand-made trace (kernels credited to the step that
launched them, GPU busy time as the union of kernels, host time split into own times) and the
serving benchmark's roofline."""

from __future__ import annotations

import pytest

from sgjit.bench.trace_summary import step_kind, summarize, union_us


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_step_kinds():
    assert step_kind("step decode=256 prefill=768") == ("mixed", 1024)
    assert step_kind("step decode=3 prefill=0") == ("decode", 3)
    assert step_kind("step decode=0 prefill=512") == ("prefill", 512)
    assert step_kind("multi rows=32 steps=8") == ("multi", 256)
    assert step_kind("aten::mm") is None


def test_union():
    assert union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20


def test_kernels_and_host_time_per_step():
    events = [
        # a mixed step on the host, 0-100 us: one op (60 us, of which a launch call is 10 us)
        _x("user_annotation", "step decode=2 prefill=30", 0, 100),
        _x("cpu_op", "aten::mm", 10, 60),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 10, correlation=7),
        # a multi-step launch, 200-210 us, whose graph runs two kernels
        _x("user_annotation", "multi rows=4 steps=8", 200, 10),
        _x("cuda_runtime", "cudaGraphLaunch", 202, 5, correlation=8),
        # device side: the mixed step's kernel 50-150, the graph's kernels 220-300 and 280-320
        _x("kernel", "gemm", 50, 100, tid=7, correlation=7),
        _x("kernel", "attn", 220, 80, tid=7, correlation=8),
        _x("kernel", "norm", 280, 40, tid=7, correlation=8),
    ]
    s = summarize({"traceEvents": events}, top=5)
    assert s["window_ms"] == pytest.approx(0.27)  # 50..320
    assert s["gpu_busy_ms"] == pytest.approx(0.2)  # 100 + (220..320)
    steps = {r["kind"]: r for r in s["steps"]}
    assert steps["mixed"]["gpu_ms_per_step"] == pytest.approx(0.1)
    assert steps["mixed"]["host_ms_per_step"] == pytest.approx(0.1)
    assert steps["mixed"]["tokens_per_step"] == 32
    assert steps["multi"]["gpu_ms_per_step"] == pytest.approx(0.12)
    assert steps["multi"]["span_ms_per_step"] == pytest.approx(0.1)
    own = {h["name"]: h["own_ms_per_step"] for h in s["host_top"]}
    assert own["aten::mm"] == pytest.approx(0.05)  # 60 less the 10 us launch inside it
    assert own["cudaLaunchKernel"] == pytest.approx(0.01)
    assert own["(the step's own code, outside recorded ops)"] == pytest.approx(0.04)
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "attn", "norm"]


def test_serving_roofline_counts_shared_kv_once_a_step():
    """The shared-prefix workload's bound reads the shared system prompts' KV once a step, not once a
    row: 8 rows of 100 own tokens and a 1000-token shared prefix move weights + 1800 tokens of KV."""
    from sgjit.bench.serving import decode_roofline

    info = {"weight_bytes": 1000.0, "kv_bytes_per_token": 1.0}
    assert decode_roofline(info, 1e-9, 8, 100, 1000) == pytest.approx(8 / 2800)
    assert decode_roofline(info, 1e-9, 8, 1100) == pytest.approx(8 / 9800)


def test_megakernel_trace_reads_phases_off_the_barrier_stamps():
    """bench.megakernel_trace: a phase's work runs from the previous barrier's release to the last
    arrival, its spread from the first arrival to the last, its release from the last arrival to the
    barrier opening; the LM head from the last release to the kernel's end. The traced CTA's own
    phase splits into its wait (its previous arrival to its seeing the release), its input (to its
    prologue's end; nothing where the phase has no prologue) and the rest (to its next arrival)."""
    import numpy as np

    from sgjit.bench.megakernel_trace import PHASES, SLOTS, summarize

    layers = 2
    t = np.zeros((SLOTS, 6), dtype=np.int64)
    clock = 1_000
    t[SLOTS - 1, 0] = clock
    for i in range(1 + 5 * layers):  # phase i: 2 us of work, arrivals 0.5 us apart, 0.3 us to open
        t[i, :3] = (clock + 1_500, clock + 2_000, clock + 2_300)
        # the traced CTA: arrives 0.2 us before the last, sees the release 0.4 us after it opened,
        # its input ready 0.6 us later (none after a q|k|v barrier: the attention phase has no prologue)
        before_attention = i % 5 == 1
        t[i, 3:] = (clock + 1_800, clock + 2_700, 0 if before_attention else clock + 3_300)
        clock += 2_300
    t[SLOTS - 1, 1] = clock + 7_000
    got = summarize([t, t], layers)
    assert set(got["phases_us"]) == {"embed", *PHASES, "lm_head"}
    assert got["phases_us"]["down"] == {
        "work": 2.0, "spread": 0.5, "release": 0.3, "cta_wait": 0.9, "cta_input": 0.6, "cta_rest": 0.8
    }  # fmt: skip
    # the attention phase has no prologue: no input time, the rest runs from the release seen
    assert got["phases_us"]["attention"]["cta_input"] == 0.0
    assert got["phases_us"]["attention"]["cta_rest"] == 1.4
    assert got["phases_us"]["lm_head"]["work"] == 7.0
    assert got["layer_us"] == 5 * 2.3
    assert got["traced_step_us"] == (11 * 2_300 + 7_000) / 1e3


def test_fast_gguf_parsing_gives_transformers_the_same_model(tmp_path):
    """The peer's GGUF load with sgjit's reader and the tensor-name map built once: the same config
    and the same weights as transformers' own load, and gguf's attributes restored afterwards."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from sgjit.bench.peers import fast_gguf_parsing

    from tiny_gguf import tiny_hf_llama, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_hf_llama(259), qtype="Q8_0")
    saved = gguf.GGUFReader, gguf.get_tensor_name_map

    def load() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)

    with fast_gguf_parsing():
        assert gguf.GGUFReader is not saved[0]
        ours = load()
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == saved
    theirs = load()
    assert ours.config.to_dict() == theirs.config.to_dict()
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
