"""`assemble`: a `RuntimeConfig` made into what serves it — device and dtype, the checkpoint, the KV
pool sized from memory, the op table (the CUDA kernels the selector picks, or the torch/CPU ops),
the model, grammars, the decode-graph runner, scheduler and sampler. Runs on the engine thread (all
torch work happens there; see `Engine`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sgjit.errors import InvalidRequestError, SgjitError
from sgjit.kernels.batch_invariant import fixed_rows
from sgjit.kernels.cpu import cpu_ops, packed_gguf_available
from sgjit.kernels.fp8 import Fp8Weight, scaled_mm_available
from sgjit.kernels.ops import OpTable
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.kernels.spec import KernelSet, Workload
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.cuda_graph import DecodeGraphs
from sgjit.runtime.device import kv_budget_tokens, resolve_device, resolve_dtype
from sgjit.runtime.engine import EngineParts
from sgjit.runtime.grammar import GrammarCompiler
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.loader import Checkpoint, load_checkpoint
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model_runner import ModelRunner
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.sampler import Sampler
from sgjit.runtime.scheduler import Scheduler, SchedulerConfig
from sgjit.runtime.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Assembly:
    device: torch.device
    dtype: torch.dtype
    model_config: ModelConfig
    model_path: Path
    tokenizer: Tokenizer
    pool: PagedKVPool
    max_model_len: int
    ops: OpTable
    kernel_set: KernelSet | None  # the selector's choices, when the CUDA kernels are on
    model: LlamaModel
    grammars: GrammarCompiler
    parts: EngineParts


def _pool(cfg: RuntimeConfig, mc: ModelConfig, device: torch.device, dtype: torch.dtype) -> PagedKVPool:
    weight_bytes = mc.num_params() * torch.empty(0, dtype=dtype).element_size()
    kv_dtype = torch.float8_e4m3fn if cfg.kv_cache_dtype == "fp8_e4m3" else dtype
    per_token = PagedKVPool.bytes_per_token_for(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
    tokens = cfg.max_total_tokens or kv_budget_tokens(
        device, per_token, weight_bytes, cfg.mem_fraction_static,
        activation_reserve=cfg.chunked_prefill_size * mc.vocab_size * 4 + (1 << 30),
    )  # fmt: skip
    num_pages = tokens // cfg.page_size + 1  # + the scratch page
    if num_pages < 3:
        raise SgjitError(
            f"no memory left for the KV cache ({tokens} tokens); use a smaller model or raise mem_fraction_static"
        )
    return PagedKVPool(
        mc.num_layers, num_pages, cfg.page_size, mc.num_kv_heads, mc.head_dim, kv_dtype, device
    )


def _ops(
    cfg: RuntimeConfig,
    mc: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    pool: PagedKVPool,
    max_len: int,
) -> tuple[OpTable, KernelSet | None]:
    if cfg.deterministic and (device.type != "cuda" or not cfg.use_cuda_kernels):
        raise InvalidRequestError(
            "deterministic inference needs sgjit's CUDA kernels: run on a GPU with --enable-jit "
            "(or cuda_kernels=True); on CPU, or with the torch reference ops, leave it off",
            "deterministic",
        )
    if device.type == "cpu":
        return cpu_ops(dtype), None
    if not cfg.use_cuda_kernels:
        return REFERENCE_OPS, None
    from sgjit.kernels.table import cuda_op_table  # CuPy and NVRTC only when the kernels are on

    workload = Workload(cfg.max_running_requests, max_len, cfg.chunked_prefill_size, cfg.deterministic)
    ops, kernel_set = cuda_op_table(device, mc, dtype, pool.dtype, cfg.page_size, workload)
    if cfg.deterministic:
        ops = ops.with_overrides(linear=fixed_rows(ops.linear))
    return ops, kernel_set


def _keeps_quantized(cfg: RuntimeConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """GGUF weights computed on packed by sgjit's C++ CPU kernels: the default on CPU (quantization
    "auto") in float32 and bfloat16 when the kernels build; asked for with "gguf". Elsewhere, or when
    the kernels cannot be built (no compiler), they are dequantized at load."""
    if cfg.quantization not in ("auto", "gguf"):
        return False
    usable = device.type == "cpu" and packed_gguf_available(dtype)
    if cfg.quantization == "gguf" and not usable:
        raise InvalidRequestError(
            "quantization 'gguf' computes on packed weights with sgjit's C++ kernels on the CPU, in float32 "
            "or bfloat16; they need a C++ compiler (g++) and ninja (see the log for why the build failed). "
            "On this device, dtype or machine use quantization 'none' (weights dequantized at load)",
            "quantization",
        )
    return usable


def _fp8_weights(cfg: RuntimeConfig, device: torch.device, dtype: torch.dtype, ckpt: Checkpoint) -> bool:
    """FP8 layer weights: when asked for, or by default for an FP8 checkpoint on a GPU with FP8
    tensor cores (elsewhere such a checkpoint is dequantized at load)."""
    if cfg.quantization == "fp8":
        if device.type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
            raise InvalidRequestError(
                "quantization 'fp8' computes in bfloat16 or float16 on the GPU; drop --dtype float32",
                "quantization",
            )
        if device.type != "cuda":
            log.warning(
                "FP8 weights on %s run on the reference path (fp32 math): for checking, not speed", device
            )
        return True
    has_fp8 = any(isinstance(w, Fp8Weight) for w in ckpt.weights.values())
    return (
        cfg.quantization == "auto" and has_fp8 and device.type == "cuda"
        and scaled_mm_available(device.index or 0) and dtype in (torch.bfloat16, torch.float16)
    )  # fmt: skip


def assemble(cfg: RuntimeConfig) -> Assembly:
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if device.type == "cpu" and cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    ckpt = load_checkpoint(cfg.model, device, dtype, keep_quantized=_keeps_quantized(cfg, device, dtype))
    mc, tokenizer = ckpt.config, ckpt.tokenizer
    pool = _pool(cfg, mc, device, dtype)
    max_model_len = min(cfg.max_model_len or mc.max_position_embeddings, pool.capacity_tokens)
    ops, kernel_set = _ops(cfg, mc, device, dtype, pool, max_model_len)
    model = LlamaModel(
        mc, ckpt.weights, ops, device, dtype, max_positions=max(max_model_len, mc.max_position_embeddings),
        rope_freq_factors=ckpt.rope_freq_factors, fp8_weights=_fp8_weights(cfg, device, dtype, ckpt),
    )  # fmt: skip
    eos = mc.eos_token_ids or tokenizer.eos_token_ids
    graphs = None
    if device.type == "cuda" and (cfg.enable_jit or cfg.use_cuda_graph):
        # the static-shape decode path (batch buckets, multi-step); captured unless CUDA graphs are off
        graphs = DecodeGraphs(
            model, pool, cfg.cuda_graph_max_bs, max_model_len, steps=cfg.multi_step, eos_token_ids=eos,
            capture=cfg.use_cuda_graph,
        )  # fmt: skip
    parts = EngineParts(
        runner=ModelRunner(model, pool, graphs),
        scheduler=Scheduler(
            pool,
            RadixCache(pool.allocator, cfg.page_size, enabled=cfg.enable_prefix_cache),
            SchedulerConfig(cfg.chunked_prefill_size, cfg.max_running_requests, cfg.schedule_policy),
        ),
        sampler=Sampler(ops, device, mc.vocab_size, cfg.seed),
        tokenizer=tokenizer,
        eos_token_ids=eos,
        max_model_len=max_model_len,
    )
    return Assembly(
        device=device, dtype=dtype, model_config=mc, model_path=ckpt.path, tokenizer=tokenizer, pool=pool,
        max_model_len=max_model_len, ops=ops, kernel_set=kernel_set, model=model,
        grammars=GrammarCompiler(tokenizer, mc.vocab_size, eos), parts=parts,
    )  # fmt: skip
