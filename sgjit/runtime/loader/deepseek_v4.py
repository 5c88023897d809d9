"""DeepSeek-V4 checkpoints into the names and layouts `DeepseekV4Model` reads (transformers' module
names: `model.layers.3.self_attn.q_a_proj.weight`, experts stacked as `mlp.experts.gate_up_proj`).

DeepSeek's released files name tensors after its own inference code (`layers.3.attn.wq_a.weight`,
`layers.3.ffn.experts.7.w1.weight`, `embed.weight`, ...), and transformers' `save_pretrained` writes
those names back too (with a `model.` prefix); both are read here, as are transformers' module names.
The released files keep most GEMM weights in FP8 e4m3 with one e8m0 scale per 128x128 block
(`<name>.scale`) and the routed experts in FP4 e2m1 with one e8m0 scale per 32 inputs; both are
dequantized here (to bf16, exactly: every value is a small float times a power of two). The
multi-token-prediction layers (`mtp.*`) are dropped: sgjit does not run them."""

from __future__ import annotations

import logging
import re

import torch

from sgjit.errors import ModelFormatError
from sgjit.kernels.fp4 import dequantize_e2m1
from sgjit.kernels.fp8 import FP8, dequantize_blocks

log = logging.getLogger(__name__)

# outside the layers, below an optional `model.`
_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
_TOP |= {v.removeprefix("model."): v for v in list(_TOP.values())} | {
    "embed_tokens.weight": "model.embed_tokens.weight"
}
# a decoder layer's tensors, below `layers.<i>.` / `model.layers.<i>.`
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.norm.weight": "self_attn.kv_norm.weight",  # what transformers' save_pretrained writes
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
for _hc in ("attn", "ffn"):
    _LAYER |= {f"hc_{_hc}_{leaf}": f"{_hc}_hc.{leaf}" for leaf in ("fn", "base", "scale")}
_COMPRESSOR = {"wkv.weight": "kv_proj.weight", "wgate.weight": "gate_proj.weight", "ape": "position_bias",
               "norm.weight": "kv_norm.weight"}  # fmt: skip
for _src, _dst in (("attn.compressor.", "self_attn.compressor."),
                   ("attn.indexer.compressor.", "self_attn.compressor.indexer.")):  # fmt: skip
    _LAYER |= {_src + k: _dst + v for k, v in _COMPRESSOR.items()}
_LAYER |= {v: v for v in [*_LAYER.values(), "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
_EXPERT = re.compile(r"ffn\.experts\.(\d+)\.(w[123])\.weight")
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")


def deepseek_v4_weights(
    weights: dict[str, torch.Tensor], quantization: dict, dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """transformers' module names and layouts, every quantized weight dequantized to `dtype`."""
    block = tuple(quantization.get("weight_block_size") or (128, 128))
    dense = _dequantized(weights, (int(block[0]), int(block[1])), dtype)
    mtp = [n for n in dense if n.removeprefix("model.").startswith("mtp.")]
    if mtp:
        log.info("DeepSeek-V4: %d multi-token-prediction tensors (mtp.*) left unused", len(mtp))
    out: dict[str, torch.Tensor] = {}
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for full_name, t in dense.items():
        name = full_name.removeprefix("model.")
        if name.startswith("mtp."):
            continue
        if name in _TOP:
            out[_TOP[name]] = t
            continue
        m = _LAYER_NAME.fullmatch(name)
        rest = m.group(2) if m else ""
        if m and rest in _LAYER:
            out[f"model.layers.{m.group(1)}.{_LAYER[rest]}"] = t
        elif m and (e := _EXPERT.fullmatch(rest)):
            experts.setdefault(int(m.group(1)), {}).setdefault(int(e.group(1)), {})[e.group(2)] = t
        else:
            raise ModelFormatError(
                f"DeepSeek-V4 checkpoint tensor {full_name!r} has no known place in the model"
            )
    for layer, per_expert in experts.items():
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"], out[p + "down_proj"] = _stacked(per_expert, layer)
    return out


def _dequantized(
    weights: dict[str, torch.Tensor], block: tuple[int, int], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Each `<x>.weight` with a `<x>.scale` beside it dequantized: e4m3 by blocks, packed e2m1 (int8)
    by groups of inputs."""
    out: dict[str, torch.Tensor] = {}
    for name, t in weights.items():
        if name.endswith(".scale") and name.removesuffix("scale") + "weight" in weights:
            continue
        scale = weights.get(name.removesuffix("weight") + "scale") if name.endswith(".weight") else None
        if scale is None:
            out[name] = t
        elif t.dtype == FP8:
            out[name] = dequantize_blocks(t, scale, block, dtype)
        elif t.dtype in (torch.int8, torch.uint8):
            try:
                out[name] = dequantize_e2m1(t, scale, dtype)
            except ValueError as e:
                raise ModelFormatError(f"FP4 weight {name}: {e}") from e
        else:
            raise ModelFormatError(f"{name} has a scale but is {t.dtype}, neither FP8 e4m3 nor packed FP4")
    return out


def _stacked(per_expert: dict[int, dict[str, torch.Tensor]], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([E, 2I, H] gate|up, [E, H, I] down) from expert e's w1 (gate), w3 (up) and w2 (down)."""
    num = len(per_expert)
    if sorted(per_expert) != list(range(num)) or any(
        set(w) != {"w1", "w2", "w3"} for w in per_expert.values()
    ):
        raise ModelFormatError(f"layer {layer} of the DeepSeek-V4 checkpoint lacks some experts' w1/w2/w3")
    gate_up = torch.stack([torch.cat([per_expert[e]["w1"], per_expert[e]["w3"]]) for e in range(num)])
    down = torch.stack([per_expert[e]["w2"] for e in range(num)])
    return gate_up, down
