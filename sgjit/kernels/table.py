"""`build_ops`: the ops table a runtime serves with, from a `KernelSet`. Every CUDA op is built (its
instantiations compiled) here, up front, so no step pays NVRTC; an op whose kernels fail to compile
logs one warning naming the kernel and keeps the reference op, and an op that later fails at launch
falls back the same way (`GuardedOp`). The decode megakernel's reference is no op at all: the model's
layers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from sgjit.errors import KernelError
from sgjit.kernels import reference
from sgjit.kernels.arch import DeviceProfile, device_profile
from sgjit.kernels.cuda.module import cupy_module
from sgjit.kernels.grouped_moe import moe_experts_grouped
from sgjit.kernels.guard import GuardedOp
from sgjit.kernels.ops import OpTable
from sgjit.kernels.registry import CUDA, FUSED_OPS, GROUPED_MM, REFERENCE, variant
from sgjit.kernels.selector import KernelSelector
from sgjit.kernels.spec import KernelSet, ModelShapes, Workload

log = logging.getLogger(__name__)

MEGAKERNEL = "decode_megakernel"

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _cuda_ops(op: str, profile: DeviceProfile, shapes: ModelShapes, ks: KernelSet) -> dict[str, Callable]:
    """The kernel callables for one op, keyed by op name (the norm kernels serve two ops)."""
    from sgjit.kernels.cuda import activation, attention, gemv, norm, rope, sampling

    if ks[op].variant == GROUPED_MM:
        return {op: moe_experts_grouped}
    if op in ("sample", "apply_bitmask", "advance_decode"):  # logits are float32 whatever the model dtype
        k = sampling.Sampling(profile.sm_count)
        return {"sample": k.sample, "apply_bitmask": k.apply_bitmask, "advance_decode": k.advance_decode}
    dtype = _DTYPES[shapes.dtype]
    if op in ("rmsnorm", "add_rmsnorm"):
        widths = (shapes.hidden, shapes.head_dim) if shapes.qk_norm else (shapes.hidden,)
        k = norm.RMSNorm(dtype, shapes.dtype, widths)
        return {"rmsnorm": k.rmsnorm, "add_rmsnorm": k.add_rmsnorm}
    if op == "linear":
        t = ks[op].tunables
        return {
            op: gemv.GemvLinear(
                dtype, shapes.dtype, t["dense_rows"], t["fp8_rows"], pdl=t.get("dependent_launch", False)
            )
        }
    if op == "silu_mul":
        return {op: activation.SiluMul(dtype, shapes.dtype, profile.sm_count)}
    if op == "rope_store_kv":
        return {
            op: rope.RopeStoreKV(dtype, (shapes.dtype, shapes.kv_dtype), shapes.head_dim, shapes.rope_dim)
        }
    if op == "attention":
        t = ks[op].tunables
        return {
            op: attention.PagedAttention(
                profile,
                shapes,
                dtype,
                t["decode_tile"],
                t["prefill_tile"],
                ks.workload.max_context,
                split_len=t.get("split_len", 0),
                stream_tile=t.get("stream_decode"),
                prefill_sm90=t.get("prefill_sm90"),
                pdl=t.get("dependent_launch", False),
                small_decode_tile=t.get("small_decode_tile"),
                lean_decode=t.get("lean_decode", False),
            )  # fmt: skip
        }
    raise KeyError(f"no CUDA op {op!r}")


def _fused_ops(
    profile: DeviceProfile, shapes: ModelShapes, ks: KernelSet, unfused: OpTable
) -> dict[str, Any]:
    """The fused decode ops on the kernels, each falling back to the unfused ops of `unfused`, and
    `fused_rows`; nothing (the model stays unfused) unless the kernel set puts all four on CUDA."""
    from sgjit.kernels.cuda.fused_gemv import FusedGemv

    if any(ks[op].variant != CUDA for op in FUSED_OPS):
        return {}
    rows = min(ks[op].tunables["rows"] for op in FUSED_OPS)
    composed = reference.Composition(unfused.rmsnorm, unfused.linear, unfused.rope_store_kv, unfused.silu_mul)
    try:
        fused = FusedGemv(
            _DTYPES[shapes.dtype], shapes.dtype, shapes.kv_dtype, rows, profile.sm_count,
            profile.smem_per_block_optin, composed,
            pdl=all(ks[op].tunables.get("dependent_launch", False) for op in FUSED_OPS),
        )  # fmt: skip
    except KernelError as e:
        log.warning("fused decode kernels unavailable (%s); decode steps use the unfused ops", e)
        return {}
    ops: dict[str, Any] = {
        op: GuardedOp(op, f"gemv.cu:{op}", getattr(fused, op), getattr(composed, op)) for op in FUSED_OPS
    }
    return ops | {"fused_rows": rows}


def _no_megakernel(*_args: Any) -> None:
    """The megakernel's fallback: None, so the model runs the step layer by layer."""
    return None


def _megakernel_op(profile: DeviceProfile, shapes: ModelShapes, ks: KernelSet) -> dict[str, Any]:
    """The decode megakernel where the kernel set puts it on CUDA, guarded: after a failed launch
    every step runs layer by layer."""
    from sgjit.kernels.cuda.megakernel import DecodeMegakernel

    choice = ks[MEGAKERNEL]
    if choice.variant != CUDA:
        return {}
    try:
        mega = DecodeMegakernel(profile, shapes, choice.tunables["rows"])
    except KernelError as e:
        log.warning("decode megakernel unavailable (%s); decode steps run layer by layer", e)
        return {}
    return {MEGAKERNEL: GuardedOp(MEGAKERNEL, "megakernel.cu", mega, _no_megakernel)}


def build_ops(profile: DeviceProfile, shapes: ModelShapes, kernel_set: KernelSet) -> OpTable:
    """REFERENCE_OPS with every op the kernel set puts on a kernel replaced by its guarded kernel; the
    fused decode ops fall back to the unfused ops of this table."""
    built: dict[str, Callable] = {}
    cupy_ok = True
    if any(c.variant == CUDA for c in kernel_set.choices.values()):
        try:
            cupy_module()
        except KernelError as e:  # the CuPy kernels stay on torch; torch-built variants still serve
            log.warning("%s", e)
            cupy_ok = False
    for op, choice in kernel_set.choices.items():
        if (
            choice.variant == REFERENCE
            or (choice.variant == CUDA and not cupy_ok)
            or op in built
            or op in FUSED_OPS
            or op == MEGAKERNEL
        ):
            continue
        try:
            fns = _cuda_ops(op, profile, shapes, kernel_set)
        except KernelError as e:
            log.warning("kernel for op %s unavailable (%s); op %s uses the torch reference", op, e, op)
            continue
        for name, fn in fns.items():
            v = variant(name, kernel_set[name].variant)
            if v.name != REFERENCE:
                label = f"{v.family}.cu:{name}" if v.family else f"torch {v.name}:{name}"
                built[name] = GuardedOp(name, label, fn, getattr(reference, name))
    unfused = reference.REFERENCE_OPS.with_overrides(**built)
    if not cupy_ok:
        return unfused
    mega = _megakernel_op(profile, shapes, kernel_set)
    return unfused.with_overrides(**_fused_ops(profile, shapes, kernel_set, unfused), **mega)


def cuda_op_table(
    device: torch.device,
    model_config: Any,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    page_size: int,
    workload: Workload,
    selector: KernelSelector | None = None,
) -> tuple[OpTable, KernelSet]:
    """The op table of a runtime with the CUDA kernels on: profile the device, select, build."""
    profile = device_profile(device)
    shapes = ModelShapes.from_config(model_config, dtype, kv_dtype, page_size)
    with torch.cuda.device(device):
        kernel_set = (selector or KernelSelector()).select(profile, shapes, workload)
        log.info("kernels for %s on %s:\n%s", model_config.name, profile.name, kernel_set.describe())
        return build_ops(profile, shapes, kernel_set), kernel_set
