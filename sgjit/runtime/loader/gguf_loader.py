"""Load a GGUF file through the `gguf` package: metadata -> ModelConfig, tensors dequantized to float32
and renamed to Hugging Face names (llama.cpp's Q/K row permutation undone), and the tokenizer built
from the file's own vocabulary."""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sgjit.errors import ModelFormatError, UnsupportedModelError
from sgjit.kernels.quant import QUANT_TYPES, QuantWeight, from_gguf
from sgjit.runtime.loader.checkpoint import Checkpoint
from sgjit.runtime.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, RopeConfig
from sgjit.runtime.tokenizer import Tokenizer
from sgjit.runtime.tokenizer.gguf_vocab import tokenizer_from_gguf

log = logging.getLogger(__name__)

SUPPORTED_TENSOR_TYPES = {
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
}  # fmt: skip

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def hf_tensor_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Llama Q/K rows pairwise-interleaved per head (for its GPT-J-style rope);
    undo it to get Hugging Face's rotate-half layout."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@functools.cache
def reader_class() -> type:
    import gguf

    class Reader(gguf.GGUFReader):
        """gguf's reader over a plain ndarray view of its memory map (which the view keeps open):
        it slices the map once or more per metadata value, and every slice of an np.memmap runs
        memmap's Python __array_finalize__; SmolLM2's 49k-token vocabulary and merges parse in 0.9 s
        instead of 4.3 s (this 2-core machine). Same fields, same tensor bytes."""

        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = np.asarray(mapped)

    return Reader


def _open(path: Path) -> Any:
    """The file's reader, parsed once a process while the file stays the same (its metadata is most
    of a small model's load: ~1 s for SmolLM2's vocabulary here; several runtimes of one process, as
    a benchmark's configurations or a test suite make, share it). Tensor data stays on the map."""
    st = path.stat()
    return _parse(path.resolve(), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _parse(path: Path, size: int, mtime_ns: int) -> Any:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFormatError(f"{path} is not a GGUF file (its first bytes are {magic!r}, not b'GGUF')")
    try:
        reader = reader_class()(path)
    except Exception as e:  # the gguf package raises ValueError/IndexError/struct.error on damage
        raise ModelFormatError(
            f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); is it truncated?"
        ) from e
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ModelFormatError(f"{path} is truncated: its tensors need {end} bytes but the file has {size}")
    return reader


def _fields(reader: Any) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - a field we cannot decode is one we do not need
            continue
    return out


def config_from_gguf(meta: dict[str, Any], tensor_names: set[str], name: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported; sgjit runs {sorted(SUPPORTED_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    if get("expert_count"):
        raise UnsupportedModelError(
            "mixture-of-experts GGUF files are not supported; load the model's Hugging Face safetensors "
            "directory instead"
        )

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length") or hidden // heads)
    vocab = get("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    scaling = get("rope.scaling.type", "none")
    rope = RopeConfig(
        theta=float(get("rope.freq_base", 10000.0)),
        dim=int(get("rope.dimension_count") or head_dim),
        scaling_type="linear" if scaling == "linear" else "default",
        factor=float(get("rope.scaling.factor", 1.0) or 1.0),
        original_max_position=int(get("rope.scaling.original_context_length", 8192) or 8192),
    )
    qkv_bias, qk_norm = SUPPORTED_ARCHITECTURES[arch]
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(t) for t in (eos, eot) if t is not None))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope=rope,
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias=qkv_bias or "blk.0.attn_q.bias" in tensor_names,
        qk_norm=qk_norm,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos_ids,
        name=name,
    )


def tokenizer_from_meta(meta: dict[str, Any], config: ModelConfig) -> Tokenizer:
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelFormatError("the GGUF file carries no tokenizer (tokenizer.ggml.tokens is missing)")
    backend = tokenizer_from_gguf(
        model=meta.get("tokenizer.ggml.model", "gpt2"),
        tokens=meta["tokenizer.ggml.tokens"],
        token_types=meta.get("tokenizer.ggml.token_type"),
        merges=meta.get("tokenizer.ggml.merges"),
        scores=meta.get("tokenizer.ggml.scores"),
        pre=meta.get("tokenizer.ggml.pre"),
        add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
    )
    is_spm = meta.get("tokenizer.ggml.model") == "llama"
    return Tokenizer(
        backend,
        bos_token_id=config.bos_token_id,
        eos_token_ids=config.eos_token_ids,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", is_spm)),
        chat_template=meta.get("tokenizer.chat_template"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def _keeps_packed(hf_name: str) -> bool:
    """The GEMM weights (and the embedding, which a tied LM head multiplies by)."""
    return hf_name.endswith(("_proj.weight", "lm_head.weight", "embed_tokens.weight"))


def load_gguf(path: Path, name: str = "", keep_quantized: bool = False) -> Checkpoint:
    """`keep_quantized`: GEMM weights in a format of `sgjit.kernels.quant` stay packed
    (`QuantWeight`); everything else is dequantized to float32."""
    from gguf.quants import dequantize

    reader = _open(path)
    meta = _fields(reader)
    names = {t.name for t in reader.tensors}
    config = config_from_gguf(meta, names, name or path.stem)
    tokenizer = tokenizer_from_meta(meta, config)
    permute = config.architecture in ("llama", "mistral")
    weights: dict[str, torch.Tensor | QuantWeight] = {}
    freq_factors = None
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in SUPPORTED_TENSOR_TYPES:
            raise UnsupportedModelError(
                f"tensor {t.name!r} uses GGUF quantization type {qtype}, which sgjit does not load; "
                f"supported: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))}"
            )
        hf = hf_tensor_name(t.name)
        if (
            keep_quantized
            and hf is not None
            and qtype in QUANT_TYPES
            and _keeps_packed(hf)
            and len(t.shape) == 2
        ):
            try:
                qw = from_gguf(qtype, np.asarray(t.data), (int(t.shape[1]), int(t.shape[0])))
            except ValueError as e:
                raise ModelFormatError(
                    f"tensor {t.name!r} in {path} cannot be read ({e}); is the file truncated?"
                ) from e
            if permute and hf.endswith(("q_proj.weight", "k_proj.weight")):
                n = config.num_heads if "q_proj" in hf else config.num_kv_heads
                qw = qw.rows(unpermute_qk(np.arange(qw.out_features), n))
            weights[hf] = qw
            continue
        try:
            arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            arr = arr.reshape(tuple(int(d) for d in reversed(t.shape)))
        except (ValueError, IndexError) as e:
            raise ModelFormatError(
                f"tensor {t.name!r} in {path} cannot be read ({e}); is the file truncated?"
            ) from e
        if t.name == "rope_freqs.weight":
            freq_factors = torch.from_numpy(arr.copy())
            continue
        if hf is None:
            log.debug("ignoring GGUF tensor %s", t.name)
            continue
        if permute and hf.endswith(("q_proj.weight", "k_proj.weight")):
            n = config.num_heads if "q_proj" in hf else config.num_kv_heads
            arr = unpermute_qk(arr, n)
        weights[hf] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))
    return Checkpoint(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        path=path,
        format="gguf",
        rope_freq_factors=freq_factors,
    )
