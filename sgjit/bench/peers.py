"""The peer every benchmark runs next to sgjit: Hugging Face transformers on the same model, device
and dtype. Imported only when a benchmark asks for the peer (transformers is a test/bench extra,
never a dependency of sgjit itself)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sgjit.runtime.model.config import ModelConfig

_HF_CONFIG = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mixtral": "MixtralConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3_moe": "Qwen3MoeConfig",
}


def hf_config(cfg: ModelConfig) -> Any:
    import transformers

    rope: dict[str, Any] = {"rope_type": cfg.rope.scaling_type, "rope_theta": cfg.rope.theta}
    if cfg.rope.scaling_type == "llama3":
        rope |= {"factor": cfg.rope.factor, "low_freq_factor": cfg.rope.low_freq_factor,
                 "high_freq_factor": cfg.rope.high_freq_factor,
                 "original_max_position_embeddings": cfg.rope.original_max_position}  # fmt: skip
    fields = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, rope_parameters=rope,
    )  # fmt: skip
    return getattr(transformers, _HF_CONFIG[cfg.architecture])(**fields | _hf_moe(cfg))


def _hf_moe(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:
        return {}
    if cfg.architecture == "mixtral":  # its experts' width is the config's intermediate_size
        return {
            "num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
            "intermediate_size": moe.intermediate_size,
        }  # fmt: skip
    out = {
        "num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.intermediate_size, "norm_topk_prob": moe.norm_topk_prob,
        "decoder_sparse_step": moe.sparse_step, "mlp_only_layers": list(moe.dense_layers),
    }  # fmt: skip
    if cfg.architecture == "qwen2_moe":
        out["shared_expert_intermediate_size"] = moe.shared_intermediate_size
    return out


@contextlib.contextmanager
def fast_gguf_parsing() -> Iterator[None]:
    """While transformers loads a GGUF (model or tokenizer): gguf's reader is sgjit's subclass of it,
    which reads the same fields and tensor bytes without np.memmap's per-slice overhead, and gguf's
    tensor-name map, which transformers rebuilds for every module (~400 times for SmolLM2), is built
    once. What transformers computes from the file is unchanged; its load takes ~7 s here, not ~20."""
    import gguf

    from sgjit.runtime.loader.gguf_loader import reader_class

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = reader_class(), functools.cache(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def load_transformers(rt) -> Any:
    """The runtime's model in transformers: the same GGUF or directory, or (for `random:` shapes) a
    model of the same shape with its own random weights (speed does not depend on them)."""
    from transformers import AutoModelForCausalLM

    path, dtype = rt.model_path, rt.dtype
    if rt.model_config.name.startswith("random:"):
        with torch.device(rt.device):
            model = AutoModelForCausalLM.from_config(hf_config(rt.model_config), dtype=dtype)
    elif path.is_file():
        with fast_gguf_parsing():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(rt.device).eval()


def transformers_runner(rt, model, batch: list[list[int]]) -> Callable[[int], Any]:
    """`generate` of exactly n new tokens for the batch (left-padded), run on sgjit's engine thread:
    on CPU both then share one OpenMP pool (two pools in two threads slow each other, see Engine)."""
    width = max(len(ids) for ids in batch)
    pad = 0
    x = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=rt.device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=rt.device)

    def gen(n: int) -> Any:
        def run() -> Any:
            with torch.inference_mode():
                return model.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=pad)  # fmt: skip

        return rt.engine.call(run)

    return gen


def sgjit_runner(rt, batch: list[list[int]]) -> Callable[[int], Any]:
    def gen(n: int) -> Any:
        return rt.generate(
            input_ids=batch, sampling_params={"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
        )

    return gen


def llama_cpp_runner(rt, ids: list[int], threads: int) -> Callable[[int], Any]:
    """llama-cpp-python on the same GGUF file and prompt with `threads` threads (sgjit's engine
    thread count): greedy, exactly n new tokens (EOS not checked: `Llama.generate` yields until told
    to stop), the prompt evaluated afresh each time. Built and run on sgjit's engine thread, as the
    transformers peer: its ggml CPU backend is OpenMP too, and a second OpenMP pool on another
    thread halved sgjit's 2-thread decode here (146 -> 72 tok/s). `use_extra_bufts=False`: it
    crashes on these AMX-capable CPUs otherwise."""
    from llama_cpp import Llama

    llm = rt.engine.call(
        lambda: Llama(
            model_path=str(rt.model_path), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
            use_extra_bufts=False, verbose=False,
        )
    )  # fmt: skip

    def gen(n: int) -> Any:
        def run() -> list[int]:
            out = []
            llm.reset()  # else generate() reuses the cached prompt prefix and skips the prefill
            for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
                out.append(tok)
                if len(out) == n:
                    break
            return out

        return rt.engine.call(run)

    return gen


def weight_bytes_read(model, rows: int = 1) -> int:
    """Bytes of GEMM and norm weights a decode step of `rows` tokens reads, in the form the ops hold
    them (fp32, GGUF panels with fp32 scales, FP8 with fp32 scales, ...), plus the LM head; the
    embedding is a row gather. A sparse MoE layer reads its router, its shared expert and the
    experts the rows route to: E·(1 − (1 − k/E)^rows) of its E on average when routing spreads
    evenly, as it does on random weights (k at one row; all E at large batches)."""
    from sgjit.kernels.cpp.panels import PanelWeight
    from sgjit.kernels.fp8 import Fp8Weight
    from sgjit.runtime.model.mlp import DenseMLP

    def size(w: Any) -> int:
        if w is None:
            return 0
        if isinstance(w, PanelWeight):
            return w.nbytes
        if isinstance(w, Fp8Weight):
            return w.data.numel() + 4 * w.scale.numel()
        return w.numel() * w.element_size()

    def ffn(mlp: Any) -> float:
        if mlp is None:
            return 0
        if isinstance(mlp, DenseMLP):
            return size(mlp.gate_up) + size(mlp.down)
        e, k = mlp.num_experts, mlp.top_k
        read = 1 - (1 - k / e) ** rows  # the share of experts some row routes to
        return size(mlp.router) + ffn(mlp.shared) + read * (size(mlp.gate_up) + size(mlp.down))

    attention = ("attn_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o_proj", "ffn_norm")
    total = size(model.lm_head) + size(model.final_norm)
    for layer in model.layers:
        total += sum(size(getattr(layer, f)) for f in attention)
        total += ffn(layer.mlp)
    return int(total)
