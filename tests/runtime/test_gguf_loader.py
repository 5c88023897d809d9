"""The GGUF loader on tiny files written in the test: tensors dequantized, llama.cpp's Q/K permutation
undone, tokenizer built from the file's vocabulary."""

from __future__ import annotations

import pytest
import torch

import sgjit

from tiny_gguf import CONTROL_ID, tiny_hf_llama, write_tiny_gguf


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-4), ("F16", 5e-2), ("Q8_0", 0.2)])
def test_tiny_gguf_matches_source_model(tmp_path, qtype, tol):
    hf = tiny_hf_llama(259)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", hf, qtype=qtype)
    rt = sgjit.Runtime(str(path), device="cpu", max_total_tokens=512)
    try:
        ids = rt.tokenizer.encode("hello, tiny world!")
        assert ids == list(b"hello, tiny world!")  # no merges: one token per byte, id = byte
        out = rt.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
        )
        ours = torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]])
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
        ref = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert (ours - ref).abs().max().item() < tol
        if qtype == "F32":
            with torch.no_grad():
                greedy = hf.generate(
                    torch.tensor([ids]),
                    max_new_tokens=8,
                    do_sample=False,
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                )
            assert out["output_ids"] == greedy[0, len(ids) :].tolist()
        assert rt.tokenizer.encode("<|im_start|>x")[0] == CONTROL_ID["<|im_start|>"]
    finally:
        rt.shutdown()
