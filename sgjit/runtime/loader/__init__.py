"""Model loading: resolve a name or path, read GGUF or a Hugging Face directory into a `Checkpoint`."""

from __future__ import annotations

from pathlib import Path

import torch

from sgjit.errors import ModelNotFoundError
from sgjit.runtime.loader.checkpoint import Checkpoint
from sgjit.runtime.loader.gguf_loader import load_gguf
from sgjit.runtime.loader.hf_loader import load_hf_dir
from sgjit.runtime.loader.resolve import DEFAULT_MODEL, ModelSource, resolve_model
from sgjit.runtime.model.presets import RANDOM_PREFIX, random_weights, shape_config
from sgjit.runtime.tokenizer.byte_level import byte_level_tokenizer


def random_checkpoint(
    name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Checkpoint:
    """`random:<shape>[:<layers>]`: a real model shape with random weights and the bundled tokenizer
    (a byte-level one where the bundled model is not installed: speed needs no real vocabulary)."""
    shape, _, layers = name.removeprefix(RANDOM_PREFIX).partition(":")
    config = shape_config(shape, int(layers) if layers else None)
    try:
        bundled = load_gguf(resolve_model(DEFAULT_MODEL).path, DEFAULT_MODEL)
        tokenizer, path = bundled.tokenizer, bundled.path
    except ModelNotFoundError:
        tokenizer, path = byte_level_tokenizer(config.vocab_size), Path(name)
    config = config.with_eos(tokenizer.eos_token_ids)
    weights = random_weights(config, device=device, dtype=dtype)
    return Checkpoint(config=config, weights=weights, tokenizer=tokenizer, path=path, format="random")


def load_checkpoint(
    model: str | Path | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    keep_quantized: bool = False,
) -> Checkpoint:
    """Read a model. `device`/`dtype` only matter for `random:` shapes, which are drawn in place;
    `keep_quantized`: a GGUF file's quantized GEMM weights stay packed."""
    if isinstance(model, str) and model.startswith(RANDOM_PREFIX):
        return random_checkpoint(model, device, dtype)
    source = resolve_model(model)
    if source.format == "gguf":
        return load_gguf(source.path, source.name, keep_quantized)
    return load_hf_dir(source.path, source.name)


__all__ = ["DEFAULT_MODEL", "Checkpoint", "ModelSource", "load_checkpoint", "resolve_model"]
