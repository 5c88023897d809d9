"""Load a Hugging Face model directory: config.json, *.safetensors (one file or a sharded index),
tokenizer.json + tokenizer_config.json, generation_config.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from sgjit.errors import ModelFormatError
from sgjit.kernels.fp8 import FP8, Fp8Weight
from sgjit.runtime.loader.checkpoint import Checkpoint
from sgjit.runtime.loader.deepseek_v4 import deepseek_v4_weights
from sgjit.runtime.loader.kv_scales import pop_kv_scales
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.tokenizer import Tokenizer


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"cannot read {path}: {e}") from e


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index)["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{path} has no *.safetensors weights (sgjit does not load .bin checkpoints)")
    return files


_SCALES = ("weight_scale_inv", "weight_scale", "input_scale")


def _fp8_weights(weights: dict[str, torch.Tensor], quant: dict) -> dict[str, torch.Tensor | Fp8Weight]:
    """An FP8 checkpoint's e4m3 weights with their scales as `Fp8Weight`s: DeepSeek's block scales
    (`weight_scale_inv`, `quantization_config.weight_block_size`) or a per-tensor / per-channel
    `weight_scale`. Static activation scales (`input_scale`) are dropped: activations are scaled
    per token at run time."""
    out: dict[str, torch.Tensor | Fp8Weight] = {}
    fp8_bases = {
        n.removesuffix("weight") for n, t in weights.items() if n.endswith(".weight") and t.dtype == FP8
    }
    for name, t in weights.items():
        base, _, leaf = name.rpartition(".")
        if leaf in _SCALES and base + "." in fp8_bases:
            continue
        if name.removesuffix("weight") not in fp8_bases:
            out[name] = t
            continue
        block_inv, scale = weights.get(f"{base}.weight_scale_inv"), weights.get(f"{base}.weight_scale")
        if block_inv is not None:
            block = quant.get("weight_block_size")
            if not (isinstance(block, list) and len(block) == 2):
                raise ModelFormatError(
                    f"{name} has block scales (weight_scale_inv) but config.json's quantization_config "
                    f"has no weight_block_size [rows, cols] (got {block!r})"
                )
            out[name] = Fp8Weight.from_block_scaled(t, block_inv, (int(block[0]), int(block[1])))
        elif scale is not None:
            out[name] = Fp8Weight.from_scaled(t, scale)
        else:
            raise ModelFormatError(f"FP8 weight {name} comes without weight_scale or weight_scale_inv")
    return out


def load_hf_dir(path: Path, name: str = "") -> Checkpoint:
    raw = _read_json(path / "config.json")
    config = ModelConfig.from_hf(raw, name=name or path.name)
    gen_file = path / "generation_config.json"
    gen = _read_json(gen_file) if gen_file.is_file() else {}
    eos = list(config.eos_token_ids)
    gen_eos = gen.get("eos_token_id")
    for e in gen_eos if isinstance(gen_eos, list) else ([gen_eos] if gen_eos is not None else []):
        if e not in eos:
            eos.append(e)
    tokenizer = Tokenizer.from_hf_dir(path, raw, eos)
    config = config.with_eos(tokenizer.eos_token_ids)
    weights: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        try:
            weights.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise ModelFormatError(f"cannot read weights {f}: {e}") from e
    if config.deepseek_v4 is not None:  # DeepSeek's released layout and FP8/FP4 scales
        weights = deepseek_v4_weights(weights, raw.get("quantization_config") or {})
    kv_scales = pop_kv_scales(weights, config.num_layers)
    if any(t.dtype == FP8 for t in weights.values()):
        weights = _fp8_weights(weights, raw.get("quantization_config") or {})
    return Checkpoint(
        config=config, weights=weights, tokenizer=tokenizer, path=path, format="hf", kv_scales=kv_scales
    )
