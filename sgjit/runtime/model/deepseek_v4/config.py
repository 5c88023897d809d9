"""`DeepseekV4Config`: what DeepSeek-V4 adds to a decoder's shape, read from a Hugging Face
`config.json` the way transformers' `DeepseekV4Config` reads it (its explicit fields, and the
legacy keys DeepSeek's released configs ship: `compress_ratios`, `num_hash_layers`,
`qk_rope_head_dim`, `rope_scaling`). `ModelConfig` carries the common shape (hidden size, heads,
head_dim, vocabulary); this carries the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sgjit.errors import UnsupportedModelError

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"  # compressed entries every `csa_rate` tokens, top-k picked by an indexer
HCA = "heavily_compressed_attention"  # compressed entries every `hca_rate` tokens, all attended
LAYER_TYPES = (SLIDING, CSA, HCA)
HASH_MOE = "hash_moe"  # experts chosen by a fixed token-id table
TOPK_MOE = "moe"  # experts chosen by the router's top-k
_LEGACY_RATIOS = {0: SLIDING, 4: CSA, 128: HCA}  # the per-layer `compress_ratios` of released configs
SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")


@dataclass(frozen=True, slots=True)
class YarnScaling:
    """YaRN frequency interpolation of the compressed layers' RoPE (cos/sin are not rescaled)."""

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True, slots=True)
class DeepseekV4Config:
    layer_types: tuple[str, ...]  # per layer, one of LAYER_TYPES
    mlp_layer_types: tuple[str, ...]  # per layer, HASH_MOE or TOPK_MOE
    csa_rate: int
    hca_rate: int
    q_lora_rank: int
    rope_head_dim: int  # the trailing channels of each head that RoPE rotates
    rope_theta: float  # sliding-only layers ("main" RoPE)
    compress_rope_theta: float  # CSA/HCA layers, their compressors and the indexer ("compress" RoPE)
    compress_yarn: YarnScaling | None
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    num_shared_experts: int
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float

    def compress_rate(self, layer: int) -> int:
        """Tokens per compressed entry of `layer`; 0 for a sliding-only layer."""
        kind = self.layer_types[layer]
        return self.csa_rate if kind == CSA else self.hca_rate if kind == HCA else 0

    def params(
        self, hidden: int, num_heads: int, head_dim: int, vocab: int, tied: bool, experts: int | None = None
    ) -> int:
        """Every weight of the model (what memory must fit), the hash layers' token table included;
        with `experts`, the routed experts counted are that many a layer (top_k: what a token computes
        with), the shared ones always."""
        h, qr, hd, ihd = hidden, self.q_lora_rank, head_dim, self.index_head_dim
        hc, ffn = self.hc_mult, 3 * hidden * self.moe_intermediate_size
        attn = h * qr + qr + qr * num_heads * hd + h * hd + hd + num_heads * hd * self.o_lora_rank
        attn += self.o_groups * self.o_lora_rank * h + num_heads
        hyper = 2 * ((2 + hc) * hc * (hc * h + 1) + 3)
        total = 0
        for i, kind in enumerate(self.layer_types):
            overlap, m = (2 if kind == CSA else 1), self.compress_rate(i)
            compressor = (2 * h * overlap + m * overlap) * hd + hd if m else 0
            if kind == CSA:
                compressor += (
                    (2 * h * 2 + m * 2) * ihd + ihd + qr * self.index_n_heads * ihd + h * self.index_n_heads
                )
            router = self.num_experts * h + (
                vocab * self.top_k if self.mlp_layer_types[i] == HASH_MOE else self.num_experts
            )
            routed = self.num_experts if experts is None else experts
            moe = router + (routed + self.num_shared_experts) * ffn
            total += attn + compressor + hyper + 2 * h + moe
        head = hc * hc * h + hc + 1 + h
        return vocab * h * (1 if tied else 2) + total + head

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> DeepseekV4Config:
        n = int(cfg["num_hidden_layers"])
        head_dim = int(cfg["head_dim"])
        if int(cfg.get("num_key_value_heads") or 1) != 1:
            raise UnsupportedModelError("DeepSeek-V4 shares one K=V head; num_key_value_heads must be 1")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"DeepSeek-V4 hidden_act {cfg['hidden_act']!r} is not supported (silu)"
            )
        rates = {CSA: 4, HCA: 128} | dict(cfg.get("compress_rates") or {})
        rates[CSA] = int(cfg.get("compress_rate_csa") or rates[CSA])
        rates[HCA] = int(cfg.get("compress_rate_hca") or rates[HCA])
        scoring = cfg.get("scoring_func", "sqrtsoftplus")
        if scoring not in SCORING_FUNCS:
            raise UnsupportedModelError(f"router scoring_func {scoring!r} is not supported {SCORING_FUNCS}")
        main_theta, compress_theta, yarn = _rope(cfg)
        return cls(
            layer_types=_layer_types(cfg, n),
            mlp_layer_types=_mlp_layer_types(cfg, n),
            csa_rate=rates[CSA],
            hca_rate=rates[HCA],
            q_lora_rank=int(cfg.get("q_lora_rank", 1024)),
            rope_head_dim=_rope_head_dim(cfg, head_dim),
            rope_theta=main_theta,
            compress_rope_theta=compress_theta,
            compress_yarn=yarn,
            o_groups=int(cfg.get("o_groups", 8)),
            o_lora_rank=int(cfg.get("o_lora_rank", 1024)),
            sliding_window=int(cfg.get("sliding_window") or 128),
            index_n_heads=int(cfg.get("index_n_heads", 64)),
            index_head_dim=int(cfg.get("index_head_dim", 128)),
            index_topk=int(cfg.get("index_topk", 512)),
            hc_mult=int(cfg.get("hc_mult", 4)),
            hc_sinkhorn_iters=int(cfg.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(cfg.get("hc_eps", 1e-6)),
            num_experts=int(cfg.get("n_routed_experts", 256)),
            top_k=int(cfg.get("num_experts_per_tok", 6)),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 2048)),
            num_shared_experts=int(cfg.get("n_shared_experts", 1)),
            scoring_func=scoring,
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.5)),
            swiglu_limit=float(cfg.get("swiglu_limit", 10.0)),
        )


def _layer_types(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    """Explicit `layer_types`, else the released configs' per-layer `compress_ratios` (0 / 4 / 128),
    else transformers' default schedule (two HCA layers, then CSA and HCA alternating)."""
    types = cfg.get("layer_types")
    if types is None and cfg.get("compress_ratios") is not None:
        unknown = sorted({r for r in cfg["compress_ratios"] if r not in _LEGACY_RATIOS})
        if unknown:
            raise UnsupportedModelError(f"compress_ratios {unknown} are not among {sorted(_LEGACY_RATIOS)}")
        types = [_LEGACY_RATIOS[r] for r in cfg["compress_ratios"]]
    if types is None:
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    types = tuple(types[:n])  # released configs list the MTP layer's ratio too
    bad = sorted(set(types) - set(LAYER_TYPES))
    if len(types) != n or bad:
        raise UnsupportedModelError(
            f"layer_types must give one of {LAYER_TYPES} per layer; got {list(types)}"
        )
    return types


def _mlp_layer_types(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    types = cfg.get("mlp_layer_types")
    if types is None:
        hashed = int(cfg.get("num_hash_layers", 3))
        types = [HASH_MOE] * min(n, hashed) + [TOPK_MOE] * max(0, n - hashed)
    types = tuple(types[:n])
    if len(types) != n or set(types) - {HASH_MOE, TOPK_MOE}:
        raise UnsupportedModelError(f"mlp_layer_types must give hash_moe or moe per layer; got {list(types)}")
    return types


def _rope_head_dim(cfg: dict[str, Any], head_dim: int) -> int:
    if cfg.get("partial_rotary_factor") is not None:
        return int(head_dim * float(cfg["partial_rotary_factor"]))
    if cfg.get("qk_rope_head_dim") is not None:
        return int(cfg["qk_rope_head_dim"])
    return head_dim * 64 // 512  # transformers' default: V4's 64 of 512


def _rope(cfg: dict[str, Any]) -> tuple[float, float, YarnScaling | None]:
    """(main theta, compress theta, the compress RoPE's YaRN): `rope_parameters` nested as
    {"main", "compress"} (what transformers saves), or flat scaling keys (`rope_parameters` or the
    released configs' `rope_scaling`) that apply to the compressed layers only."""
    params = cfg.get("rope_parameters") or {}
    main_theta = float(cfg.get("rope_theta", 10000.0))
    compress_theta = float(cfg.get("compress_rope_theta", 160000.0))
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main_theta = float(params["main"].get("rope_theta", main_theta))
        if params["main"].get("rope_type", "default") != "default":
            raise UnsupportedModelError("DeepSeek-V4's sliding layers take only the default RoPE")
        scaling = params["compress"]
        compress_theta = float(scaling.get("rope_theta", compress_theta))
    else:
        scaling = {**(cfg.get("rope_scaling") or {}), **params}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return main_theta, compress_theta, None
    if kind != "yarn":
        raise UnsupportedModelError(
            f"DeepSeek-V4 compress RoPE type {kind!r} is not supported (default, yarn)"
        )
    if float(scaling.get("attention_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(
            "DeepSeek-V4's YaRN leaves cos/sin unscaled; attention_factor must be 1.0"
        )
    yarn = YarnScaling(
        factor=float(scaling["factor"]),
        original_max_position=int(scaling["original_max_position_embeddings"]),
        beta_fast=float(scaling.get("beta_fast") or 32.0),
        beta_slow=float(scaling.get("beta_slow") or 1.0),
    )
    return main_theta, compress_theta, yarn
