"""Timing on the GPU: a CUDA-event median timer, and the attention timer the selector's autotune mode
calls (one representative step per candidate tile, on synthetic paged inputs of the model's
shapes)."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

import torch

from sgjit.errors import KernelError
from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.registry import CUDA, AttnTile, variant
from sgjit.kernels.spec import ModelShapes, Workload
from sgjit.kernels.synthetic import paged_attention_case

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


def median_cuda_seconds(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Device seconds per call: the median over `reps` of events around a burst of back-to-back
    calls, the burst long enough (~2 ms) to hide the gaps between them. A call whose host overhead
    exceeds its device time is timed at the host's pace: use `median_graph_seconds` for those."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    burst = max(1, min(200, int(2e-3 / max(start.elapsed_time(end) / 1e3, 1e-6))))
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(burst):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / burst)
    return statistics.median(times)


def median_graph_seconds(fn: Callable[[], object], calls: int = 50, reps: int = 20) -> float:
    """Device seconds per call with no host in the way: `calls` calls captured in one CUDA graph,
    replayed `reps` times (median). For ops too short for `median_cuda_seconds`, whose bursts are
    paced by the host's launch overhead, and as the engine runs them (decode steps are graphs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # lazy allocations and compiles outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def attention_timer(
    profile: DeviceProfile, shapes: ModelShapes, workload: Workload, knob: str, tile: AttnTile
) -> float:
    """Seconds of one attention call with `tile` for `knob`: a decode step of min(batch, 64) rows at
    min(context, 4096), or a prefill of min(prefill tokens, 4096) tokens. A candidate that does not
    compile scores infinity."""
    from sgjit.kernels.cuda.attention import PagedAttention

    tiles = variant("attention", CUDA).tunables
    dec = tile if knob == "decode_tile" else tiles["decode_tile"][0]
    pre = tile if knob == "prefill_tile" else tiles["prefill_tile"][0]
    try:
        op = PagedAttention(profile, shapes, _TORCH_DTYPES[shapes.dtype], dec, pre, workload.max_context)
    except KernelError as e:
        log.warning("autotune: %s does not build: %s", tile.name, e)
        return float("inf")
    if knob == "decode_tile":
        b, ctx = min(workload.max_batch, 64), min(workload.max_context, 4096)
        q_lens, kv_lens = [1] * b, [ctx] * b
    else:
        n = min(workload.max_prefill_tokens, 4096)
        q_lens, kv_lens = [n], [n]
    case = paged_attention_case(
        q_lens, kv_lens, shapes.num_heads, shapes.num_kv_heads, shapes.head_dim, shapes.page_size,
        _TORCH_DTYPES[shapes.dtype], _TORCH_DTYPES[shapes.kv_dtype], "cuda",
    )  # fmt: skip
    return median_cuda_seconds(lambda: op(case.q, case.kv, case.meta, shapes.head_dim**-0.5), reps=10)
