"""Per-layer FP8 KV-cache scales carried by a checkpoint (an FP8-KV export stores, for each layer, the
scale its calibration found for K and for V: stored = value / scale). They are taken out of the
weights here and handed to the KV pool, which stores and reads that layer's pages with them; a
checkpoint without them gives an fp8 pool scale 1.0, which clips any |K|, |V| above 448.

Spellings (those vLLM reads): `model.layers.N.self_attn.k_scale` / `v_scale` (compressed-tensors,
llm-compressor), `...self_attn.k_proj.k_scale` / `v_proj.v_scale` (NVIDIA ModelOpt),
`...self_attn.qkv_proj.k_scale` / `v_scale`, `...self_attn.attn.k_scale` / `v_scale`, and the older
single `...self_attn.kv_scale` (AutoFP8) for both. GGUF files have no such tensors (llama.cpp's KV
cache types carry their own block scales)."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import torch

from sgjit.errors import ModelFormatError

log = logging.getLogger(__name__)

_NAME = re.compile(
    r"model\.layers\.(\d+)\.self_attn\.(?:(?:k_proj|v_proj|qkv_proj|attn)\.)?(k_scale|v_scale|kv_scale|q_scale|prob_scale)"
)


@dataclass(frozen=True, slots=True)
class KVScales:
    """One K and one V scale per layer."""

    k: tuple[float, ...]
    v: tuple[float, ...]


def _value(name: str, t: torch.Tensor) -> float:
    """A scale tensor as one float: per-head scales (numel > 1) become their largest, which covers
    every head's range at a coarser step."""
    x = float(t.float().abs().max()) if t.numel() > 1 else float(t.float().reshape(()))
    if not (math.isfinite(x) and x > 0):
        raise ModelFormatError(f"KV cache scale {name} is {x}; a scale must be a positive finite number")
    if t.numel() > 1:
        log.info("%s holds %d scales; the KV cache uses their largest, %g", name, t.numel(), x)
    return x


def pop_kv_scales(weights: dict[str, torch.Tensor], num_layers: int) -> KVScales | None:
    """Remove every KV-cache scale tensor from `weights` (and the attention-quantization q_scale /
    prob_scale, which sgjit does not use); the layers' K and V scales, or None when the checkpoint
    has none. A layer the checkpoint gives no scale keeps 1.0, with a warning."""
    found: dict[tuple[int, str], float] = {}
    for name in [n for n in weights if _NAME.fullmatch(n)]:
        layer_s, kind = _NAME.fullmatch(name).groups()
        t = weights.pop(name)
        layer = int(layer_s)
        if kind in ("q_scale", "prob_scale"):
            continue
        if layer >= num_layers:
            raise ModelFormatError(f"{name}: the model has {num_layers} layers")
        value = _value(name, t)
        for k in ("k_scale", "v_scale") if kind == "kv_scale" else (kind,):
            found.setdefault((layer, k), value)
    if not found:
        return None
    missing = [
        f"{layer}.{k}"
        for layer in range(num_layers)
        for k in ("k_scale", "v_scale")
        if (layer, k) not in found
    ]
    if missing:
        log.warning("the checkpoint has no KV cache scale for %s; those use 1.0", ", ".join(missing[:8]))
    return KVScales(
        k=tuple(found.get((i, "k_scale"), 1.0) for i in range(num_layers)),
        v=tuple(found.get((i, "v_scale"), 1.0) for i in range(num_layers)),
    )
