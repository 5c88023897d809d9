"""`Checkpoint`: what a loader hands to the runtime, whatever the file format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sgjit.kernels.fp8 import Fp8Weight
from sgjit.kernels.quant import QuantWeight
from sgjit.runtime.loader.kv_scales import KVScales
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.tokenizer import Tokenizer


@dataclass(slots=True)
class Checkpoint:
    config: ModelConfig
    # Hugging Face tensor names and layouts; GGUF GEMM weights may stay packed (QuantWeight), an FP8
    # checkpoint's weights come with their scales (Fp8Weight)
    weights: dict[str, torch.Tensor | QuantWeight | Fp8Weight]
    tokenizer: Tokenizer
    path: Path
    format: str  # "gguf" | "hf"
    rope_freq_factors: torch.Tensor | None = None
    kv_scales: KVScales | None = None  # an FP8-KV checkpoint's per-layer K/V cache scales
