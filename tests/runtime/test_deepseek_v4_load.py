"""Reading DeepSeek-V4: its config.json read as transformers reads it (explicit fields and the legacy
keys DeepSeek's released configs ship), and a directory in the released layout (DeepSeek's tensor
names without `model.`, GEMM weights in FP8 e4m3 with e8m0 block scales, routed experts in packed FP4
with e8m0 group scales, multi-token-prediction tensors) loading into a model that computes what
transformers computes on the dequantized values."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_deepseek_v4 import Paged, reference, sequence
from tiny_deepseek_v4 import save_tiny_v4

from sgjit.errors import ModelFormatError, UnsupportedModelError
from sgjit.kernels.fp4 import E2M1_VALUES
from sgjit.kernels.fp8 import FP8
from sgjit.runtime.loader import load_checkpoint
from sgjit.runtime.model.config import ModelConfig
from sgjit.runtime.model.deepseek_v4.config import CSA, HCA, SLIDING, DeepseekV4Config, YarnScaling

BLOCK = 16  # the FP8 block of the test directory (128 in DeepSeek's)


def test_config_reads_what_transformers_reads(tmp_path):
    legacy = dict(
        vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=32,
        compress_ratios=[0, 4, 128, 4, 128], num_hash_layers=1, qk_rope_head_dim=8, compress_rope_theta=40000.0,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                      "beta_slow": 1},
    )  # fmt: skip
    theirs = transformers.DeepseekV4Config(**legacy)
    ours = DeepseekV4Config.from_hf(legacy)
    assert list(ours.layer_types) == theirs.layer_types == [SLIDING, CSA, HCA, CSA]
    assert list(ours.mlp_layer_types) == theirs.mlp_layer_types == ["hash_moe", "moe", "moe", "moe"]
    assert ours.rope_head_dim == theirs.qk_rope_head_dim == 8
    compress = theirs.rope_parameters["compress"]
    assert ours.compress_rope_theta == compress["rope_theta"] == 40000.0
    assert ours.compress_yarn == YarnScaling(16.0, 65536, 32.0, 1.0) and compress["rope_type"] == "yarn"
    # what transformers writes back reads the same
    theirs.save_pretrained(tmp_path)
    saved = DeepseekV4Config.from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert saved == ours
    mc = ModelConfig.from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert (mc.architecture, mc.num_kv_heads, mc.rope.dim, mc.deepseek_v4) == ("deepseek_v4", 1, 8, ours)
    # a token computes with top_k routed experts of a layer (and the shared ones)
    per_expert = 3 * mc.hidden_size * ours.moe_intermediate_size
    skipped = len(ours.layer_types) * (ours.num_experts - ours.top_k) * per_expert
    assert mc.num_params() - mc.active_params() == skipped > 0


def test_config_errors_name_the_field():
    base = dict(num_hidden_layers=2, head_dim=32)
    with pytest.raises(UnsupportedModelError, match="num_key_value_heads"):
        DeepseekV4Config.from_hf(base | {"num_key_value_heads": 2})
    with pytest.raises(UnsupportedModelError, match="compress_ratios"):
        DeepseekV4Config.from_hf(base | {"compress_ratios": [0, 16]})
    with pytest.raises(UnsupportedModelError, match="scoring_func"):
        DeepseekV4Config.from_hf(base | {"scoring_func": "relu"})


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 data and an e8m0 (power-of-two) scale per BLOCK x BLOCK tile."""
    n, k = w.shape
    tiles = w.reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK).abs().amax(dim=(1, 3))
    scale = torch.exp2(torch.ceil(torch.log2(tiles.clamp(min=1e-30) / 448.0)))
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return (w / full).to(FP8), scale.to(torch.float8_e8m0fnu)


def _fp4(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed e2m1 codes (low nibble first) and an e8m0 scale per `group` inputs of a row."""
    n, k = w.shape
    amax = w.reshape(n, k // group, group).abs().amax(dim=-1)
    scale = torch.exp2(torch.ceil(torch.log2(amax.clamp(min=1e-30) / 6.0)))
    x = w / scale.repeat_interleave(group, 1)
    values = torch.tensor(E2M1_VALUES)
    codes = (x[..., None] - values).abs().argmin(dim=-1).to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8), scale.to(torch.float8_e8m0fnu)


def _dequantized(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if data.dtype == FP8:
        return data.float() * scale.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    codes = data.view(torch.uint8)
    values = torch.tensor(E2M1_VALUES)[torch.stack([codes & 15, codes >> 4], dim=-1).flatten(-2).long()]
    return values * scale.float().repeat_interleave(values.shape[1] // scale.shape[1], 1)


def _released_dir(tmp_path, runtime):
    """The tiny model saved, renamed to DeepSeek's layout and quantized; and transformers' model of
    the dequantized values of exactly what was written, loaded by transformers from its own names."""
    backend = runtime.tokenizer.backend
    path, source = tmp_path / "released", tmp_path / "dequantized"
    save_tiny_v4(source, backend.get_vocab_size(), backend)
    (st,) = source.glob("*.safetensors")
    saved = load_file(str(st))  # DeepSeek's leaf names below `model.`, one tensor per expert
    top = {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base",
           "hc_head.hc_scale": "hc_head_scale"}  # fmt: skip
    released = {}
    for name, t in saved.items():
        short = name.removeprefix("model.")
        short = top.get(short, short).replace(".attn.norm.", ".attn.kv_norm.")
        if ".experts." in short and short.endswith(".weight"):
            data, scale = _fp4(t)
        elif any(f".{p}." in short for p in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "w1", "w2", "w3")) and (
            "compressor" not in short
        ):
            data, scale = _fp8(t)
        else:
            released[short] = t
            continue
        released[short], released[short.removesuffix("weight") + "scale"] = data, scale
        saved[name] = _dequantized(data, scale)
    released["mtp.0.emb.tok_emb.weight"] = torch.zeros(4, 4)  # sgjit leaves the MTP layers unused
    save_file(saved, str(st), metadata={"format": "pt"})
    shutil.copytree(source, path, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(released, str(path / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                  "weight_block_size": [BLOCK, BLOCK]}  # fmt: skip
    (path / "config.json").write_text(json.dumps(cfg))
    hf = transformers.DeepseekV4ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    return path, hf, released


def test_released_layout_loads_and_matches_transformers_on_its_values(tmp_path, runtime):
    path, hf, released = _released_dir(tmp_path, runtime)
    assert released["layers.1.attn.wq_b.weight"].dtype == FP8
    assert released["layers.1.ffn.experts.3.w2.weight"].dtype == torch.int8
    assert released["layers.1.ffn.shared_experts.w2.weight"].dtype == FP8
    weights = load_checkpoint(path).weights
    assert not any(n.startswith(("mtp.", "model.mtp")) for n in weights)
    assert weights["model.layers.2.mlp.experts.gate_up_proj"].shape == (8, 64, 64)
    paged = Paged(path, page_size=8)
    tokens = sequence(40, 5)
    (logits,) = paged.step([(tokens, 0, 40, paged.pages(40))])
    assert (logits - reference(hf, tokens)).abs().max().item() < 1e-4


def test_an_unknown_tensor_is_a_clear_error(tmp_path, runtime):
    path, _, _ = _released_dir(tmp_path, runtime)
    (st,) = path.glob("*.safetensors")
    tensors = load_file(str(st))
    tensors["layers.0.attn.wq_c.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(st), metadata={"format": "pt"})
    with pytest.raises(ModelFormatError, match="wq_c"):
        load_checkpoint(path)
