"""`RuntimeConfig`: every knob of a runtime, with its default, in one place. The server's flags map
onto these fields one to one."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sgjit.errors import InvalidRequestError
from sgjit.settings import env


@dataclass(slots=True)
class RuntimeConfig:
    model: str | None = None  # bundled name, .gguf path or Hugging Face directory; None = smollm2-135m
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str | None = None  # None/"auto" = bf16 on GPU, fp32 on CPU; or "float32" | "bfloat16" | "float16"
    enable_jit: bool = False  # all three below at once, unless one is set on its own
    plan_jit: bool | None = None  # compile and cache prompt programs (plans); None = enable_jit
    cuda_kernels: bool | None = None  # GPU: sgjit's CUDA kernels chosen by the selector; None = enable_jit
    cuda_graph: bool | None = None  # GPU: decode steps captured as CUDA graphs; None = enable_jit
    page_size: int = 16
    max_total_tokens: int | None = None  # KV pool size in tokens; None = sized from memory
    mem_fraction_static: float = 0.85  # GPU: share of device memory for weights + KV pool
    max_model_len: int | None = None  # None = the model's context, capped by the pool
    max_running_requests: int = 256
    max_waiting_requests: int = 4096
    chunked_prefill_size: int = 2048  # prompt tokens a step computes, at most
    # a step with decode rows: decode rows + prompt tokens within this. None: 2048 on a GPU, where it
    # served 8464 output tok/s at TPOT p99 26 ms in the 8B serving benchmark on an H100 against 6712
    # tok/s and 36 ms at 1024 (a mixed step costs the host about the same whatever its tokens, so
    # fewer, larger ones win: docs/performance.md, "Serving: graphs captured at start-up"); 1024 on a
    # CPU, where a step's time grows with its tokens and longer ones only stall the decoding rows more
    mixed_step_tokens: int | None = None
    schedule_policy: str = "fcfs"  # "fcfs" | "lpm"
    enable_prefix_cache: bool = True
    kv_cache_dtype: str = "auto"  # "auto" | "fp8_e4m3"
    # "auto": a GGUF file's 4/8-bit GEMM weights stay packed on the CPU (sgjit's C++ kernels compute
    # on them; dequantized where those cannot be built or on a GPU), FP8 checkpoints stay FP8 on GPUs
    # with FP8 tensor cores, everything else is dequantized; "gguf": packed GGUF weights or an error;
    # "fp8": the layers' GEMM weights in FP8 e4m3 with per-channel scales (quantized at load unless
    # the checkpoint is FP8); "none": dequantized
    quantization: str = "auto"
    jit_cache_limit: int = 64
    jit_arg_budget: int = 256  # tokens a compiled plan reserves for each argument in its worst case
    cuda_graph_max_bs: int = 256
    # capture every batch bucket's decode graph while loading (sgjit serve does by default), so no
    # request waits for a capture once traffic comes; else each is captured when first needed
    cuda_graph_warmup: bool = False
    multi_step: int = 8  # decode steps per multi-step launch (GPU, on the decode-graph path)
    # launch step N+1 while step N runs on the device, reading step N's tokens there; None = on a GPU
    # with tp = 1 (the other tensor-parallel ranks need every step's tokens from rank 0's host)
    overlap_schedule: bool | None = None
    # the bucketed decode path (static buffers, batch and context buckets, multi-step launches that
    # pick tokens on the device): None = on a GPU with the JIT or CUDA graphs, on a CPU when
    # SGJIT_EAGER_DECODE_GRAPHS=1; True on the CPU runs it eagerly, for tests and for measuring the
    # engine's host time per step there
    bucketed_decode: bool | None = None
    deterministic: bool = False  # GPU + CUDA kernels: a request's tokens independent of its batch
    seed: int | None = None
    num_threads: int | None = None  # CPU intra-op threads; None = torch's default (tp > 1: cores / ranks)
    # tensor-parallel ranks: one process per GPU (on a CPU, per share of its cores), started by the
    # runtime itself, or by torchrun (RANK/WORLD_SIZE set); docs/architecture.md
    tp: int = 1

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise InvalidRequestError(f"runtime option {name}={getattr(self, name)!r} {what}", name)

        need(self.page_size in (1, 2, 4, 8, 16, 32, 64, 128), "page_size", "must be a power of two up to 128")
        need(0.0 < self.mem_fraction_static < 1.0, "mem_fraction_static", "must be in (0, 1)")
        need(self.max_running_requests >= 1, "max_running_requests", "must be >= 1")
        need(self.chunked_prefill_size >= self.page_size, "chunked_prefill_size", "must be >= page_size")
        need(
            self.mixed_step_tokens is None or self.mixed_step_tokens >= 4 * self.page_size,
            "mixed_step_tokens",
            "must be None or >= 4 x page_size",
        )
        need(self.schedule_policy in ("fcfs", "lpm"), "schedule_policy", "must be 'fcfs' or 'lpm'")
        need(self.kv_cache_dtype in ("auto", "fp8_e4m3"), "kv_cache_dtype", "must be 'auto' or 'fp8_e4m3'")
        need(
            self.quantization in ("auto", "gguf", "fp8", "none"),
            "quantization",
            "must be 'auto', 'gguf', 'fp8' or 'none'",
        )
        need(self.jit_cache_limit >= 1, "jit_cache_limit", "must be >= 1")
        need(self.multi_step >= 1, "multi_step", "must be >= 1")
        need(isinstance(self.tp, int) and self.tp >= 1, "tp", "must be an integer >= 1")
        need(
            self.tp == 1 or self.quantization != "gguf",
            "quantization",
            "(computing on packed GGUF blocks) runs on one CPU process; with tp > 1 use quantization 'auto'",
        )
        need(
            self.tp == 1 or not self.overlap_schedule,
            "overlap_schedule",
            "cannot hold with tp > 1: the other ranks take each step's input tokens from rank 0's host, "
            "which has not read them back yet when the next step is launched; leave it unset",
        )
        need(
            self.tp == 1 or not self.deterministic,
            "deterministic",
            "cannot hold with tp > 1: the all-reduce's summation order changes with the batch size",
        )
        need(
            self.max_total_tokens is None or self.max_total_tokens >= 2 * self.page_size,
            "max_total_tokens",
            "must hold at least two pages",
        )
        need(
            self.dtype in (None, "auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"),
            "dtype",
            "must be auto, float32, bfloat16 or float16",
        )

    @property
    def use_plan_jit(self) -> bool:
        return self.enable_jit if self.plan_jit is None else self.plan_jit

    @property
    def use_cuda_kernels(self) -> bool:
        return self.enable_jit if self.cuda_kernels is None else self.cuda_kernels

    @property
    def use_cuda_graph(self) -> bool:
        return self.enable_jit if self.cuda_graph is None else self.cuda_graph

    def use_bucketed_decode(self, device_type: str) -> bool:
        if self.bucketed_decode is not None:
            return self.bucketed_decode
        if device_type == "cpu":
            return env().eager_decode_graphs
        return device_type == "cuda" and (self.enable_jit or self.use_cuda_graph)

    def use_overlap(self, device_type: str) -> bool:
        if self.overlap_schedule is None:
            return device_type == "cuda" and self.tp == 1
        return self.overlap_schedule

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> RuntimeConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidRequestError(
                f"unknown runtime option(s) {unknown}; known: {sorted(known)}", unknown[0]
            )
        return cls(**kwargs)  # type: ignore[arg-type]
