"""Model loading: resolve a name or path, read GGUF or a Hugging Face directory into a `Checkpoint`."""

from __future__ import annotations

from pathlib import Path

from sgjit.runtime.loader.checkpoint import Checkpoint
from sgjit.runtime.loader.gguf_loader import load_gguf
from sgjit.runtime.loader.hf_loader import load_hf_dir
from sgjit.runtime.loader.resolve import DEFAULT_MODEL, ModelSource, resolve_model


def load_checkpoint(model: str | Path | None = None) -> Checkpoint:
    source = resolve_model(model)
    if source.format == "gguf":
        return load_gguf(source.path, source.name)
    return load_hf_dir(source.path, source.name)


__all__ = ["DEFAULT_MODEL", "Checkpoint", "ModelSource", "load_checkpoint", "resolve_model"]
