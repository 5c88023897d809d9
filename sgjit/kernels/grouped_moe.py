"""The `moe_experts` op on the GPU as two grouped GEMMs (`torch._grouped_mm`): every (token,
choice) pair sorted by expert, then one launch runs all experts' gate|up products over their own
slices of the sorted rows and one launch all the down products. On sm_90 and sm_100 with bf16
operands torch runs a CUTLASS grouped kernel that reads the group offsets on the device, so the op
never waits for the host and a CUDA graph can capture it; elsewhere torch loops over the groups
with the offsets copied to the host, which the selector avoids by keeping the reference op.

The kernel reads 16-byte aligned rows: the hidden and expert widths must be multiples of 8."""

from __future__ import annotations

import torch

from sgjit.kernels.arch import DeviceProfile
from sgjit.kernels.reference import silu_mul
from sgjit.kernels.spec import ModelShapes

GROUPED_ARCHS = (9, 10)  # major compute capabilities torch builds its bf16 grouped kernel for
ROW_ALIGN = 8  # bf16 elements in 16 bytes


def grouped_unsupported(profile: DeviceProfile, shapes: ModelShapes) -> str | None:
    """Why the grouped path cannot serve this model on this device (None when it can)."""
    if shapes.experts == 0:
        return "a dense model has no experts"
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm (it came in 2.8)"
    if profile.compute_capability[0] not in GROUPED_ARCHS:
        return "torch's grouped GEMM kernel is built for sm_90 and sm_100 only (elsewhere it syncs per call)"
    if shapes.hidden % ROW_ALIGN or shapes.expert_intermediate % ROW_ALIGN:
        return f"hidden {shapes.hidden} and expert width {shapes.expert_intermediate} must be multiples of 8"
    return None


def moe_experts_grouped(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    n, k = topk_ids.shape
    num_experts = w_gate_up.shape[0]
    sorted_ids, order = topk_ids.reshape(-1).sort(stable=True)
    # offs[e] = end of expert e's rows in the sorted order; an expert without tokens repeats its
    # predecessor's end (an empty group)
    experts = torch.arange(num_experts, device=x.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32)
    rows = x[order // k]
    h = torch._grouped_mm(rows, w_gate_up.transpose(1, 2), offs=offs)
    y = torch._grouped_mm(silu_mul(h), w_down.transpose(1, 2), offs=offs)
    unsorted = torch.empty_like(y)
    unsorted[order] = y  # back to (token, choice) order: a fixed-order sum per token, no atomics
    weighted = unsorted.view(n, k, -1).float() * topk_weights.float()[..., None]
    return weighted.sum(1).to(x.dtype)
