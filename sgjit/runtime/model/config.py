"""`ModelConfig`: the shape of a Llama-family decoder, read from a Hugging Face `config.json` or from
GGUF metadata. Everything the model, the KV pool and the kernel selector need about a model is here;
DeepSeek-V4 keeps what it adds in `deepseek_v4` (model/deepseek_v4/config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sgjit.errors import UnsupportedModelError
from sgjit.runtime.model.deepseek_v4.config import DeepseekV4Config

DEEPSEEK_V4 = "deepseek_v4"  # its own decoder (model/deepseek_v4/)

# Architectures that share the one decoder in llama.py. Values: (qkv bias, per-head q/k norm).
SUPPORTED_ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}

_HF_ARCH_NAMES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "DeepseekV4ForCausalLM": DEEPSEEK_V4,
}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float = 10000.0
    dim: int = 0  # rotary dimension (== head_dim for every supported model)
    scaling_type: str = "default"  # "default" | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = ""
    deepseek_v4: DeepseekV4Config | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def num_params(self) -> int:
        if self.deepseek_v4 is not None:
            return self.deepseek_v4.params(
                self.hidden_size, self.num_heads, self.head_dim, self.vocab_size, self.tie_word_embeddings
            )
        h, i = self.hidden_size, self.intermediate_size
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head

    def with_eos(self, eos_token_ids: tuple[int, ...]) -> ModelConfig:
        return replace(self, eos_token_ids=eos_token_ids)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str = "") -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((_HF_ARCH_NAMES[a] for a in archs if a in _HF_ARCH_NAMES), None)
        if arch is None:
            arch = cfg.get("model_type")
        if arch == DEEPSEEK_V4:
            return _deepseek_v4_from_hf(cfg, name)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"model architecture {archs or cfg.get('model_type')!r} is not supported; "
                f"sgjit runs {sorted(_HF_ARCH_NAMES)}"
            )
        qkv_bias, qk_norm = SUPPORTED_ARCHITECTURES[arch]
        qkv_bias = bool(cfg.get("attention_bias", qkv_bias))
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(cfg, head_dim),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg),
            name=name,
        )


def _eos_ids(cfg: dict[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())


def _deepseek_v4_from_hf(cfg: dict[str, Any], name: str) -> ModelConfig:
    """The common shape of a DeepSeek-V4 decoder (one shared K=V head; `rope` is its sliding layers'
    partial RoPE; `intermediate_size` an expert's width) and its own config beside it."""
    v4 = DeepseekV4Config.from_hf(cfg)
    return ModelConfig(
        architecture=DEEPSEEK_V4,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=v4.moe_intermediate_size,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=int(cfg["num_attention_heads"]),
        num_kv_heads=1,
        head_dim=int(cfg["head_dim"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=RopeConfig(theta=v4.rope_theta, dim=v4.rope_head_dim),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 1048576)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg),
        name=name,
        deepseek_v4=v4,
    )


def _rope_from_hf(cfg: dict[str, Any], head_dim: int) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(f"rope scaling type {kind!r} is not supported (default, linear, llama3)")
    return RopeConfig(
        theta=theta,
        dim=int(head_dim * float(cfg.get("partial_rotary_factor", 1.0))),
        scaling_type=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )
