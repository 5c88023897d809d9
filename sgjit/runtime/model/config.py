"""`ModelConfig`: the shape of a Llama-family decoder, read from a Hugging Face `config.json` or from
GGUF metadata, with `MoeConfig` for the sparse mixture-of-experts families (Mixtral, Qwen2-MoE,
Qwen3-MoE) whose layers differ only in the feed-forward. Everything the model, the KV pool and the
kernel selector need about a model is here; DeepSeek-V4 keeps what it adds in `deepseek_v4`
(model/deepseek_v4/config.py)."""

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
    "mixtral": (False, False),
    "qwen2_moe": (True, False),
    "qwen3_moe": (False, True),
}

_HF_ARCH_NAMES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "DeepseekV4ForCausalLM": DEEPSEEK_V4,
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
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
class MoeConfig:
    """The sparse feed-forward: each token runs its `top_k` of `num_experts` SwiGLU experts (width
    `intermediate_size`), weighted by the router's softmax (renormalised over the chosen ones when
    `norm_topk_prob`); Qwen2-MoE adds a shared expert that every token runs. Qwen's configs may keep
    some layers dense (`mlp_only_layers`, or all but every `decoder_sparse_step`-th)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_intermediate_size: int = 0  # 0 = no shared expert
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    def params(self, hidden: int, experts: int) -> int:
        """Weights of a sparse layer's feed-forward counting `experts` routed experts."""
        shared = 3 * hidden * self.shared_intermediate_size + (hidden if self.shared_intermediate_size else 0)
        return self.num_experts * hidden + experts * 3 * hidden * self.intermediate_size + shared


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
    moe: MoeConfig | None = None

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
        """Every weight the model holds (what memory must fit)."""
        if self.deepseek_v4 is not None:
            return self._v4_params(None)
        return self._params(self.moe.num_experts if self.moe else 0)

    def active_params(self) -> int:
        """The weights one token computes with: a sparse layer counts only its top-k experts
        (what a token's FLOPs scale with). Equal to `num_params()` for a dense model."""
        if self.deepseek_v4 is not None:
            return self._v4_params(self.deepseek_v4.top_k)
        return self._params(self.moe.top_k if self.moe else 0)

    def _v4_params(self, experts: int | None) -> int:
        v4 = self.deepseek_v4
        assert v4 is not None
        return v4.params(
            self.hidden_size,
            self.num_heads,
            self.head_dim,
            self.vocab_size,
            self.tie_word_embeddings,
            experts,
        )

    def _params(self, experts: int) -> int:
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 2 * h
        attn += (self.q_size + 2 * self.kv_size) * self.qkv_bias + 2 * self.head_dim * self.qk_norm
        layers = 0
        for layer in range(self.num_layers):
            sparse = self.moe is not None and self.moe.is_sparse(layer)
            layers += attn + (self.moe.params(h, experts) if sparse else 3 * h * i)
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + layers + h + head

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
        qkv_bias = bool(cfg.get("attention_bias", cfg.get("qkv_bias", qkv_bias)))
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
            moe=_moe_from_hf(cfg, arch),
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


def _moe_from_hf(cfg: dict[str, Any], arch: str) -> MoeConfig | None:
    if arch == "mixtral":  # every layer sparse, the chosen experts' weights always renormalised
        return MoeConfig(
            num_experts=int(cfg["num_local_experts"]),
            top_k=int(cfg["num_experts_per_tok"]),
            intermediate_size=int(cfg["intermediate_size"]),
            norm_topk_prob=True,
        )
    if arch not in ("qwen2_moe", "qwen3_moe"):
        return None
    # transformers >= 5 may write Qwen3-MoE's expert count as `num_local_experts`
    experts = int(cfg.get("num_experts", cfg.get("num_local_experts", 0)))
    if experts == 0:  # transformers builds every layer dense then
        return None
    return MoeConfig(
        num_experts=experts,
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
        if arch == "qwen2_moe"
        else 0,
        sparse_step=int(cfg.get("decoder_sparse_step") or 1),
        dense_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
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
