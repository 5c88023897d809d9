"""kernel_profile's reading of an Nsight Compute raw page (no GPU, no ncu): units scaled, the case's own
rate, and the warp stall reasons a summary names first."""

from __future__ import annotations

from sgjit.bench import kernel_profile as kp

# What `ncu --import R --csv --page raw` prints: a header, a row of units (first cell empty), a launch a row.
RAW = """==PROF== some banner line
"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread","launch__shared_mem_per_block_dynamic","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio","smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio","smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio","smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio"
"","","usecond","register/thread","Kibyte","ratio","ratio","ratio","ratio","ratio","ratio","ratio","ratio"
"0","void attention_sm90_kernel<__nv_bfloat16, 128>(const T1 *, int)","1,402.1","168","164.86","2.31","0.12","1.00","0.87","0.64","n/a","0.05","0.01"
"""


def _summary(kernel: dict) -> str:
    """The summary of one ncu kernel and no timeline."""
    return kp.summary_text(
        {
            "dir": "/tmp/p",
            "gpu": "H100",
            "ncu": {"ok": True, "kernels": [kernel]},
            "nsys": {"ok": False, "note": "-"},
        }
    )


def test_raw_page_gives_time_rate_and_the_leading_stalls():
    (row,) = kp._csv_rows(RAW, '"ID"', units_row=True)
    flops = 4 * 4096**2 * 32 * 128 / 2
    k = kp._ncu_kernel(row, "prefill bf16", {"flops": flops})
    assert k["name"] == "attention_sm90_kernel<__nv_bfloat16, 128>"
    assert k["time_us"] == 1402.1 and k["regs"] == 168.0  # a thousands separator read
    assert abs(k["tflops"] - flops / 1402.1e-6 / 1e12) < 1e-6
    # largest first, at most TOP_STALLS (tex_throttle, the seventh, left out), a value that is not a number
    # left out
    assert list(k["stalls"]) == [
        "barrier",
        "selected",
        "wait",
        "math_pipe_throttle",
        "long_scoreboard",
        "dispatch_stall",
    ]
    assert k["stalls"]["math_pipe_throttle"] == 0.64 and "sleeping" not in k["stalls"]
    text = _summary(k)
    assert "prefill bf16 | attention_sm90_kernel" in text
    assert "165 Kibyte" in text  # a unit the table does not convert is printed as given
    assert "stalls (warps a issued instruction): barrier 2.31, selected 1.00, wait 0.87" in text


def test_a_launch_without_stall_metrics_has_no_stall_line():
    raw = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","nsecond"\n"0","merge_splits_kernel<float>(int)","5300"\n'
    (row,) = kp._csv_rows(raw, '"ID"', units_row=True)
    k = kp._ncu_kernel(row, "decode bf16", {"bytes": 1e6})
    assert k["time_us"] == 5.3 and k["stalls"] == {} and "kv_gbps" not in k  # a merge gets no case rate
    assert "stalls" not in _summary(k)


# What `ncu --import R --csv --page source --print-source sass` prints for one launch (columns cut down).
SOURCE = """==PROF== some banner line
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x7f0","@!P0 BRA 0x7fb0","1,050","1,000"
"0x800","UMOV UR19, 0x40000040","770","700"
"0x810","WARPGROUP.DEPBAR.LE gsb0, 0x1","650","600"
"0x820","MUFU.EX2 R90, R90","400","300"
"0x830","MUFU.EX2 R91, R91","300","200"
"0x840","HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], R88","200","100"
"0x850","FFMA R1, R2, R3, R4","0","0"
"0x860","NOP","n/a",""
"""


def test_source_page_names_the_instructions_the_warps_stall_on():
    hot = kp.source_hotspots(SOURCE)
    total = 1050 + 770 + 650 + 400 + 300 + 200
    assert hot["samples"] == total
    # by opcode (predicate and modifiers dropped), largest first
    assert list(hot["by_opcode"]) == ["BRA", "UMOV", "MUFU", "WARPGROUP", "HGMMA"]
    assert abs(hot["by_opcode"]["MUFU"] - 100 * 700 / total) < 1e-9
    # the instructions with samples, largest first, at most HOT_INSTRUCTIONS; none without samples
    assert [h["address"] for h in hot["top"]] == ["0x7f0", "0x800", "0x810", "0x820", "0x830", "0x840"]
    assert (
        hot["top"][0]["sass"] == "@!P0 BRA 0x7fb0" and abs(hot["top"][0]["pct"] - 100 * 1050 / total) < 1e-9
    )
    k = {"name": "attention_sm90_kernel", "case": "prefill bf16", "hot": hot}
    text = _summary(k)
    assert "stall samples by opcode: BRA 31.2%, UMOV 22.8%" in text
    assert " 31.2%  0x7f0  @!P0 BRA 0x7fb0" in text


def test_source_page_without_samples_gives_nothing():
    assert kp.source_hotspots("") == {}
    assert (
        kp.source_hotspots(
            SOURCE.replace('"1,050"', '"0"')
            .replace('"770"', '"0"')
            .replace('"650"', '"0"')
            .replace('"400"', '"0"')
            .replace('"300"', '"0"')
            .replace('"200"', '"0"')
        )
        == {}
    )
