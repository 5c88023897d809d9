"""What the server reports about itself: the device's arch (from the compiler's `DeviceProfile`),
the ops and kernel set, JIT state, the model; shared by the ready line, /get_model_info and
/get_server_info."""

from __future__ import annotations

import time
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from sgjit.kernels.arch import DeviceProfile, arch_hash, device_profile
from sgjit.kernels.spec import dtype_name
from sgjit.version import __version__

if TYPE_CHECKING:
    from sgjit.runtime.runtime import Runtime
    from sgjit.server.state import ServerState


def device_arch(profile: DeviceProfile) -> str:
    """`cpu`, or the GPU's name and SM version (e.g. `NVIDIA H200 sm_90`)."""
    return f"{profile.name} sm_{profile.cc}" if profile.is_cuda else "cpu"


def op_table(rt: Runtime) -> dict[str, str]:
    """Which function each op of the model's op table runs."""
    out = {}
    for f in fields(rt.ops):
        fn = getattr(rt.ops, f.name)
        out[f.name] = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return out


def kernel_choices(rt: Runtime) -> dict[str, dict[str, Any]] | None:
    """The kernel selector's choice per op, with its tunables and reason (JIT on a GPU only)."""
    kernel_set = rt.kernel_set
    if kernel_set is None:
        return None
    return {
        op: {
            "variant": c.variant,
            "tunables": {k: _plain(v) for k, v in c.tunables.items()},
            "reason": c.reason,
        }
        for op, c in kernel_set.choices.items()
    }


def _plain(value: Any) -> Any:
    return (
        value
        if isinstance(value, (bool, int, float, str, type(None)))
        else getattr(value, "name", str(value))
    )


def jit_switches(rt: Runtime) -> dict[str, bool]:
    """Which parts of the JIT this runtime uses (the CUDA ones only on a GPU)."""
    cfg = rt.config
    return {
        "plan_jit": cfg.use_plan_jit,
        "cuda_kernels": rt.kernel_set is not None,
        "cuda_graph": cfg.use_cuda_graph and rt.device.type == "cuda",
    }


def jit_info(rt: Runtime, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "enabled": rt.config.enable_jit,
        **jit_switches(rt),
        "cache_limit": rt.config.jit_cache_limit,
        "compiles": stats.get("jit_compiles"),
        "cache_hits": stats.get("jit_cache_hits"),
    }


def model_info(state: ServerState) -> dict[str, Any]:
    rt = state.loaded()
    mc = rt.model_config
    return {
        "model_path": str(rt.model_path),
        "tokenizer_path": str(rt.model_path),
        "served_model_name": state.model_name,
        "is_generation": True,
        "model_type": mc.architecture,
        "architectures": [mc.architecture],
        "preferred_sampling_params": None,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "architecture": mc.architecture,
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "num_layers": mc.num_layers,
        "num_heads": mc.num_heads,
        "num_kv_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim,
        "max_model_len": rt.max_model_len,
        "dtype": dtype_name(rt.dtype),
        "device": str(rt.device),
        "num_params": mc.num_params(),
        "active_params": mc.active_params(),  # a token's share: less than num_params for MoE models
        "weight_bytes": mc.num_params() * torch.empty(0, dtype=rt.dtype).element_size(),
        "kv_bytes_per_token": rt.pool.bytes_per_token,
    }


def server_info(state: ServerState) -> dict[str, Any]:
    rt = state.loaded()
    stats = state.stats() or {}
    profile = device_profile(rt.device)
    return {
        "version": __version__,
        "phase": state.phase.value,
        "uptime_s": time.time() - state.started_at,
        "server_args": state.args.public_dict(),
        "request_limits": state.args.limits(),
        "device": str(rt.device),
        "arch": device_arch(profile),
        "arch_hash": arch_hash(profile),
        "device_profile": profile.as_dict(),
        "dtype": dtype_name(rt.dtype),
        "ops": op_table(rt),
        "kernel_set": kernel_choices(rt),
        "jit": jit_info(rt, stats),
        "kv_capacity_tokens": rt.pool.capacity_tokens,
        "max_model_len": rt.max_model_len,
        "load_seconds": rt.load_seconds,
        "stats": stats,
    }


def ready_line(state: ServerState, url: str) -> str:
    rt = state.loaded()
    on = [name for name, used in jit_switches(rt).items() if used]
    jit = ("on: " + ", ".join(on)) if on else "off"
    return (
        f"sgjit ready at {url} | model {state.model_name} ({rt.model_path.name}) | device {rt.device} "
        f"{dtype_name(rt.dtype)}{f' x tp {rt.config.tp}' if rt.config.tp > 1 else ''} | arch "
        f"{device_arch(device_profile(rt.device))} | JIT {jit} | KV cache "
        f"{rt.pool.capacity_tokens} tokens ({rt.pool.allocator.num_usable} pages x {rt.config.page_size}) | "
        f"context {rt.max_model_len}"
    )
