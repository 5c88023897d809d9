"""FP8 checkpoints as they are published: e4m3 layer weights with a per-channel `weight_scale`
(compressed-tensors / ModelOpt style) or DeepSeek's 128x128 block scales (`weight_scale_inv` plus
`quantization_config.weight_block_size`; 32x32 here). A tiny transformers Llama is saved, its layer
weights replaced by FP8 + scales, and sgjit must load the directory and compute what transformers
computes on the dequantized weights: on the CPU such weights are dequantized at load (`auto`), or kept
FP8 and computed by the reference product (`quantization='fp8'`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_hf_dirs import ARCHS
from tiny_hf import save_tiny_hf

import sgjit
from sgjit.errors import ModelFormatError
from sgjit.kernels.fp8 import FP8, Fp8Weight

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = 32


def _block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 data and one inverse scale per BLOCK x BLOCK tile (ragged at the edges)."""
    n, k = w.shape
    rows, cols = -(-n // BLOCK), -(-k // BLOCK)
    scale = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK]
            scale[i, j] = tile.abs().max().clamp(min=1e-12) / 448.0
    full = scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return (w / full).to(FP8), scale


def _fp8_dir(tmp_path, runtime, layout: str):
    """The tiny Llama's directory with FP8 layer weights; the transformers model gets the dequantized
    values of exactly what was written (for block scales: after sgjit's per-channel re-quantization,
    which is what its loader computes on)."""
    cls_name, extra = ARCHS["llama3"]
    path = tmp_path / "llama3"
    hf = save_tiny_hf(path, cls_name, runtime.tokenizer.backend, **extra)
    (st,) = path.glob("*.safetensors")
    tensors = load_file(str(st))
    state = hf.state_dict()
    for name in list(tensors):
        if not (name.endswith(".weight") and any(f".{p}." in name for p in PROJ)):
            continue
        w = tensors[name].float()
        base = name.removesuffix(".weight")
        if layout == "channel":
            q = Fp8Weight.quantize(w)
            tensors[name], tensors[f"{base}.weight_scale"] = q.data, q.scale[:, None].clone()
        else:
            data, scale_inv = _block_quantize(w)
            tensors[name], tensors[f"{base}.weight_scale_inv"] = data, scale_inv
            q = Fp8Weight.from_block_scaled(data, scale_inv, (BLOCK, BLOCK))
        state[name].copy_(q.dequantize())
    save_file(tensors, str(st), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    quant = {"quant_method": "fp8", "fmt": "e4m3"}
    if layout == "block":
        quant["weight_block_size"] = [BLOCK, BLOCK]
    cfg["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(cfg))
    return path, hf


def _logprobs(rt, ids):
    out = rt.generate(
        input_ids=ids,
        sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        return_logprob=True,
        logprob_start_len=0,
    )
    return torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]), out["output_ids"]


@pytest.mark.parametrize("layout", ["channel", "block"])
@pytest.mark.parametrize("quantization", ["auto", "fp8"])
def test_fp8_checkpoint_matches_transformers_on_its_values(tmp_path, runtime, layout, quantization):
    path, hf = _fp8_dir(tmp_path, runtime, layout)
    ids = runtime.tokenizer.encode("The quick brown fox jumps over the lazy dog, 12345 times!")
    with sgjit.Runtime(str(path), device="cpu", max_total_tokens=1024, quantization=quantization) as rt:
        layer = rt.model.layers[0]
        assert isinstance(layer.qkv, Fp8Weight) == (quantization == "fp8")
        ours, tokens = _logprobs(rt, ids)
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        ref = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        greedy = hf.generate(
            torch.tensor([ids]), max_new_tokens=8, do_sample=False, attention_mask=torch.ones(1, len(ids))
        )
    assert (ours - ref).abs().max().item() < 1e-3
    assert tokens == greedy[0, len(ids) :].tolist()


def test_block_scales_without_block_size_are_a_clear_error(tmp_path, runtime):
    path, _ = _fp8_dir(tmp_path, runtime, "block")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["quantization_config"]["weight_block_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="weight_block_size"):
        sgjit.Runtime(str(path), device="cpu", max_total_tokens=1024)
