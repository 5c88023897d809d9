"""`assemble`: a `RuntimeConfig` made into what serves it — device and dtype, the checkpoint, the KV
pool sized from memory, the op table (the CUDA kernels the selector picks, or the torch/CPU ops),
the model, grammars, the decode-graph runner, scheduler and sampler. Runs on the engine thread (all
torch work happens there; see `Engine`). Under tensor parallelism every rank runs `build_model` (its
share of the model, its KV pool and graphs); only rank 0 goes on to the engine's parts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from sgjit.errors import InvalidRequestError, SgjitError
from sgjit.kernels.batch_invariant import fixed_rows
from sgjit.kernels.cpu import cpu_ops, packed_gguf_available
from sgjit.kernels.fp8 import Fp8Weight, scaled_mm_available
from sgjit.kernels.ops import OpTable
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.kernels.registry import REFERENCE
from sgjit.kernels.spec import KernelSet, Workload
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.cuda_graph import DecodeGraphs
from sgjit.runtime.device import kv_budget_tokens, rank_device, resolve_dtype
from sgjit.runtime.engine import EngineParts
from sgjit.runtime.futures import TokenFutures
from sgjit.runtime.grammar import GrammarCompiler
from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.loader import Checkpoint, load_checkpoint
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.deepseek_v4.cache import DeepseekV4KVPool
from sgjit.runtime.model.deepseek_v4.model import DeepseekV4Model
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model_runner import ModelRunner
from sgjit.runtime.parallel.comm import ModelComm
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.parallel.shard import ShardPlan, query_heads_per_rank, shard_weights
from sgjit.runtime.parallel.step import StepChannel
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.sampler import Sampler
from sgjit.runtime.scheduler import Scheduler, SchedulerConfig
from sgjit.runtime.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelParts:
    """What every rank builds. `model_config` is the whole model's; `model` holds this rank's share."""

    device: torch.device
    dtype: torch.dtype
    model_config: ModelConfig
    model_path: Path
    tokenizer: Tokenizer
    pool: PagedKVPool | DeepseekV4KVPool
    max_model_len: int
    ops: OpTable
    kernel_set: KernelSet | None
    model: LlamaModel | DeepseekV4Model
    futures: TokenFutures  # the tokens of the launch in flight, on the device (futures.py)
    graphs: DecodeGraphs | None
    eos_token_ids: tuple[int, ...]


@dataclass(slots=True)
class Assembly:
    device: torch.device
    dtype: torch.dtype
    model_config: ModelConfig
    model_path: Path
    tokenizer: Tokenizer
    pool: PagedKVPool | DeepseekV4KVPool
    max_model_len: int
    ops: OpTable
    kernel_set: KernelSet | None  # the selector's choices, when the CUDA kernels are on
    model: LlamaModel | DeepseekV4Model
    grammars: GrammarCompiler
    parts: EngineParts


def _pool(
    cfg: RuntimeConfig,
    ckpt: Checkpoint,
    plan: ShardPlan,
    device: torch.device,
    dtype: torch.dtype,
    tp: TPGroup,
) -> PagedKVPool | DeepseekV4KVPool:
    """Sized for this rank's share of the model (`plan`: its weights and KV heads); the ranks take the
    smallest of their page counts, so one page table serves them all."""
    mc = plan.local_config(ckpt.config)
    weight_bytes = plan.num_params(ckpt.config) * torch.empty(0, dtype=dtype).element_size()
    kv_dtype = torch.float8_e4m3fn if cfg.kv_cache_dtype == "fp8_e4m3" else dtype
    if mc.deepseek_v4 is not None:
        per_token = DeepseekV4KVPool.bytes_per_token_for(mc.deepseek_v4, mc.head_dim, cfg.page_size, dtype)
    else:
        per_token = PagedKVPool.bytes_per_token_for(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
    tokens = cfg.max_total_tokens or kv_budget_tokens(
        device, per_token, weight_bytes, cfg.mem_fraction_static,
        activation_reserve=cfg.chunked_prefill_size * mc.vocab_size * 4 + (1 << 30),
    )  # fmt: skip
    num_pages = tp.agree_min(tokens // cfg.page_size + 1)  # + the scratch page
    if num_pages < 3:
        raise SgjitError(
            f"no memory left for the KV cache ({tokens} tokens); use a smaller model or raise mem_fraction_static"
        )
    if mc.deepseek_v4 is not None:
        return DeepseekV4KVPool(mc.deepseek_v4, mc.head_dim, num_pages, cfg.page_size, dtype, device)
    if ckpt.kv_scales is not None and kv_dtype != torch.float8_e4m3fn:
        log.info(
            "the checkpoint's FP8 KV cache scales are unused: the KV cache is %s (kv_cache_dtype)", kv_dtype
        )
    elif ckpt.kv_scales is None and kv_dtype == torch.float8_e4m3fn:
        log.warning(
            "fp8 KV cache without scales from the checkpoint: K and V are stored unscaled (scale 1.0)"
        )
    return PagedKVPool(
        mc.num_layers, num_pages, cfg.page_size, mc.num_kv_heads, mc.head_dim, kv_dtype, device, ckpt.kv_scales
    )  # fmt: skip


def _deepseek_v4_checks(cfg: RuntimeConfig, device: torch.device) -> None:
    """What DeepSeek-V4 runs on today: the torch ops (its attention, compressors and indexer have no
    CUDA kernels yet), eager steps, dequantized weights, a KV cache in the compute dtype."""
    for ok, param, what in (
        (cfg.kv_cache_dtype == "auto", "kv_cache_dtype", "an fp8 KV cache"),
        (cfg.quantization in ("auto", "none"), "quantization", f"quantization {cfg.quantization!r}"),
        (not cfg.deterministic, "deterministic", "deterministic inference"),
    ):
        if not ok:
            raise InvalidRequestError(
                f"DeepSeek-V4 does not support {what} yet; leave {param} at its default", param
            )
    if device.type == "cuda" and (cfg.use_cuda_kernels or cfg.use_cuda_graph):
        log.warning(
            "DeepSeek-V4 runs on the torch reference ops without CUDA graphs: sgjit's CUDA kernels and decode "
            "graphs do not cover its attention yet"
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
    if cfg.deterministic and mc.moe is not None:
        raise InvalidRequestError(
            "deterministic inference does not cover mixture-of-experts models yet (their grouped expert "
            "GEMMs are not batch-invariant); leave it off for this model",
            "deterministic",
        )
    if device.type == "cpu":
        return cpu_ops(dtype), None
    if not cfg.use_cuda_kernels or mc.deepseek_v4 is not None:
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
    the kernels cannot be built (no compiler), they are dequantized at load; so they are under tensor
    parallelism (its shards split dense and FP8 weights; RuntimeConfig refuses "gguf" with tp > 1)."""
    if cfg.quantization not in ("auto", "gguf") or cfg.tp > 1:
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


def _graph_capturable(mc: ModelConfig, kernel_set: KernelSet | None) -> bool:
    """Whether decode steps can be captured: an MoE model's experts on the torch reference op read
    their token counts on the host every step, which a graph cannot replay, so its steps then run
    eagerly (same buckets, no graphs)."""
    if mc.moe is None or (kernel_set is not None and kernel_set["moe_experts"].variant != REFERENCE):
        return True
    why = kernel_set["moe_experts"].reason if kernel_set is not None else "the CUDA kernels are off"
    log.warning("MoE experts run on the torch reference op (%s): decode steps run without CUDA graphs", why)
    return False


def build_model(cfg: RuntimeConfig, tp: TPGroup) -> ModelParts:
    """This rank's device, share of the model, KV pool, op table and decode graphs."""
    device = rank_device(cfg.device, tp.local_rank)
    dtype = resolve_dtype(cfg.dtype, device)
    threads = cfg.num_threads or (max(1, (os.cpu_count() or 1) // tp.local_size) if tp.size > 1 else None)
    if device.type == "cpu" and threads:  # ranks on one host share its cores
        torch.set_num_threads(threads)
    ckpt = load_checkpoint(cfg.model, device, dtype, keep_quantized=_keeps_quantized(cfg, device, dtype))
    mc, tokenizer = ckpt.config, ckpt.tokenizer
    if mc.deepseek_v4 is not None:
        _deepseek_v4_checks(cfg, device)
    plan = ShardPlan.of(mc, tp.size, tp.rank)
    local = plan.local_config(mc)
    weights = ckpt.weights if tp.size == 1 else shard_weights(ckpt.weights, mc, plan)
    if tp.rank == 0 and tp.size > 1 and len(set(query_heads_per_rank(mc, tp.size))) > 1:
        log.warning(
            "%d query / %d KV heads do not split evenly over %d ranks: query heads per rank %s (the "
            "busiest rank sets the pace)",
            mc.num_heads, mc.num_kv_heads, tp.size, query_heads_per_rank(mc, tp.size),
        )  # fmt: skip
    pool = _pool(cfg, ckpt, plan, device, dtype, tp)
    max_model_len = min(cfg.max_model_len or mc.max_position_embeddings, pool.capacity_tokens)
    ops, kernel_set = _ops(cfg, local, device, dtype, pool, max_model_len)
    if mc.deepseek_v4 is not None:
        model: LlamaModel | DeepseekV4Model = DeepseekV4Model(mc, weights, ops, device, dtype)
    else:
        model = LlamaModel(
            local, weights, ops, device, dtype, max_positions=max(max_model_len, mc.max_position_embeddings),
            rope_freq_factors=ckpt.rope_freq_factors, fp8_weights=_fp8_weights(cfg, device, dtype, ckpt),
            comm=ModelComm(tp, plan.vocab.start, mc.vocab_size),
        )  # fmt: skip
    eos = mc.eos_token_ids or tokenizer.eos_token_ids
    futures = TokenFutures(cfg.multi_step, max(cfg.max_running_requests, cfg.cuda_graph_max_bs), device)
    graphs = None
    if cfg.use_bucketed_decode(device.type) and isinstance(model, LlamaModel):
        # the static-shape decode path (batch buckets, multi-step); captured unless CUDA graphs are off
        graphs = DecodeGraphs(
            model, pool, futures, cfg.cuda_graph_max_bs, max_model_len, steps=cfg.multi_step,
            eos_token_ids=eos,
            capture=device.type == "cuda" and cfg.use_cuda_graph and _graph_capturable(mc, kernel_set),
        )  # fmt: skip
    return ModelParts(
        device=device, dtype=dtype, model_config=mc, model_path=ckpt.path, tokenizer=tokenizer, pool=pool,
        max_model_len=max_model_len, ops=ops, kernel_set=kernel_set, model=model, futures=futures,
        graphs=graphs, eos_token_ids=eos,
    )  # fmt: skip


def assemble(cfg: RuntimeConfig, tp: TPGroup | None = None) -> Assembly:
    """Rank 0's runtime (the only one without tensor parallelism); `tp` is its group where it has one."""
    tp = tp or TPGroup()
    m = build_model(cfg, tp)
    mixed = cfg.mixed_step_tokens or (2048 if m.device.type == "cuda" else 1024)  # see RuntimeConfig
    scheduling = SchedulerConfig(
        cfg.chunked_prefill_size, cfg.max_running_requests, cfg.schedule_policy, mixed, m.max_model_len
    )
    parts = EngineParts(
        runner=ModelRunner(m.model, m.pool, m.futures, m.graphs, StepChannel(tp) if tp.size > 1 else None),
        scheduler=Scheduler(
            m.pool, RadixCache(m.pool.allocator, cfg.page_size, enabled=cfg.enable_prefix_cache), scheduling
        ),
        sampler=Sampler(m.ops, m.device, m.model_config.vocab_size, cfg.seed),
        tokenizer=m.tokenizer,
        eos_token_ids=m.eos_token_ids,
        max_model_len=m.max_model_len,
        overlap=cfg.use_overlap(m.device.type),
    )
    return Assembly(
        device=m.device, dtype=m.dtype, model_config=m.model_config, model_path=m.model_path,
        tokenizer=m.tokenizer, pool=m.pool, max_model_len=m.max_model_len, ops=m.ops, kernel_set=m.kernel_set,
        model=m.model, grammars=GrammarCompiler(m.tokenizer, m.model_config.vocab_size, m.eos_token_ids),
        parts=parts,
    )  # fmt: skip
