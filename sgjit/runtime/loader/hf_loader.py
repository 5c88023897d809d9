"""Load a Hugging Face model directory: config.json, *.safetensors (one file or a sharded index),
tokenizer.json + tokenizer_config.json, generation_config.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from sgjit.errors import ModelFormatError
from sgjit.runtime.loader.checkpoint import Checkpoint
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
    return Checkpoint(config=config, weights=weights, tokenizer=tokenizer, path=path, format="hf")
