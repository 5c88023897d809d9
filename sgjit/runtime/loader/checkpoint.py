"""`Checkpoint`: what a loader hands to the runtime, whatever the file format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sgjit.kernels.quant import QuantWeight
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.tokenizer import Tokenizer


@dataclass(slots=True)
class Checkpoint:
    config: ModelConfig
    # Hugging Face tensor names and layouts; GGUF GEMM weights may stay packed (QuantWeight)
    weights: dict[str, torch.Tensor | QuantWeight]
    tokenizer: Tokenizer
    path: Path
    format: str  # "gguf" | "hf"
    rope_freq_factors: torch.Tensor | None = None
