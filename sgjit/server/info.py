"""What the server reports about itself: the device's arch, the kernel set, JIT state, the model;
shared by the ready line, /get_model_info and /get_server_info."""

from __future__ import annotations

import time
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

import sgjit

if TYPE_CHECKING:
    from sgjit.runtime.runtime import Runtime
    from sgjit.server.state import ServerState


def device_arch(device: torch.device) -> str:
    """`cpu`, or the GPU's name and SM version (e.g. `NVIDIA H100 80GB HBM3 sm_90`)."""
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"


def kernel_set(rt: Runtime) -> dict[str, str]:
    """Which implementation each op of the model's op table runs."""
    out = {}
    for f in fields(rt.ops):
        fn = getattr(rt.ops, f.name)
        out[f.name] = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return out


def jit_info(rt: Runtime, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "enabled": rt.config.enable_jit,
        "cache_limit": rt.config.jit_cache_limit,
        "compiles": stats.get("jit_compiles"),
        "cache_hits": stats.get("jit_cache_hits"),
    }


def model_info(state: ServerState) -> dict[str, Any]:
    rt = state.loaded()
    mc = rt.model_config
    return {
        "model_path": str(rt.model_path),
        "served_model_name": state.model_name,
        "is_generation": True,
        "architecture": mc.architecture,
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "num_layers": mc.num_layers,
        "num_heads": mc.num_heads,
        "num_kv_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim,
        "max_model_len": rt.max_model_len,
        "dtype": dtype_name(rt.dtype),
    }


def server_info(state: ServerState) -> dict[str, Any]:
    rt = state.loaded()
    stats = rt.stats()
    return {
        "version": sgjit.__version__,
        "phase": state.phase.value,
        "uptime_s": time.time() - state.started_at,
        "server_args": state.args.public_dict(),
        "device": str(rt.device),
        "arch": device_arch(rt.device),
        "dtype": dtype_name(rt.dtype),
        "kernels": kernel_set(rt),
        "jit": jit_info(rt, stats),
        "kv_capacity_tokens": rt.pool.capacity_tokens,
        "max_model_len": rt.max_model_len,
        "load_seconds": rt.load_seconds,
        "stats": stats,
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def ready_line(state: ServerState, url: str) -> str:
    rt = state.loaded()
    jit = "on" if rt.config.enable_jit else "off"
    return (
        f"sgjit ready at {url} | model {state.model_name} ({rt.model_path.name}) | device {rt.device} "
        f"{dtype_name(rt.dtype)} | arch {device_arch(rt.device)} | JIT {jit} | KV cache "
        f"{rt.pool.capacity_tokens} tokens ({rt.pool.allocator.num_usable} pages x {rt.config.page_size}) | "
        f"context {rt.max_model_len}"
    )
