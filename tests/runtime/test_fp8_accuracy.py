"""FP8 weights against full precision on real weights: the bundled SmolLM2-135M with its layers' weights
as per-channel e4m3 (`quantization="fp8"`; on the CPU the reference path computes in fp32 on the
dequantized FP8 values, so the difference is the weights' rounding alone), against the same GGUF
dequantized to fp32 (`quantization="none"`). Teacher-forced prompt log-probs, the top-1 prediction
at each prompt position, and 32 greedy tokens. Measured 2026-12-06 (docs/performance.md): mean
|d log-prob| 0.12-0.20 nats a prompt (max 0.65), top-1 agreement 89-100%, greedy text identical for
1 to 32 of 32 tokens. A 135M model is the hard case for 8-bit floats (few, narrow layers); the bounds
below hold those figures with headroom, so a broken scale (every logit off) fails them. Slow: two
runtimes and 4 prompts on the CPU, about a minute."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [
    "The history of the Roman Empire spans many centuries, beginning with",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n",
    "Photosynthesis is the process by which plants",
    "Q: What is the capital of France?\nA:",
]
MEAN_NATS = 0.3  # measured 0.12-0.20
TOP1_AGREEMENT = 0.8  # measured 0.89-1.0 a prompt


@pytest.mark.slow
def test_fp8_weights_stay_close_to_full_precision(dense_runtime):
    import sgjit

    fp8 = sgjit.Runtime(device="cpu", max_total_tokens=4096, seed=0, quantization="fp8")
    params = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
    agree_total = positions = 0
    try:
        for prompt in PROMPTS:
            ids = dense_runtime.tokenizer.encode(prompt)
            outs = [
                rt.generate(
                    input_ids=ids,
                    sampling_params=params,
                    return_logprob=True,
                    logprob_start_len=0,
                    top_logprobs_num=1,
                )  # fmt: skip
                for rt in (dense_runtime, fp8)
            ]
            ref, got = (
                torch.tensor([e[0] for e in o["meta_info"]["input_token_logprobs"][1:]]) for o in outs
            )
            top_ref, top_got = ([t[0][1] for t in o["meta_info"]["input_top_logprobs"][1:]] for o in outs)
            agree = sum(a == b for a, b in zip(top_ref, top_got))
            same = next(
                (i for i, (a, b) in enumerate(zip(*(o["output_ids"] for o in outs))) if a != b), params["max_new_tokens"]
            )  # fmt: skip
            diff = (ref - got).abs()
            print(
                f"{len(ids)} tokens: |d log-prob| mean {diff.mean():.3f} max {diff.max():.3f} nats, "
                f"top-1 agreement {agree}/{len(top_ref)}, greedy identical for {same}/32 tokens"
            )
            assert diff.mean() < MEAN_NATS, prompt
            assert agree >= TOP1_AGREEMENT * len(top_ref), prompt
            assert same >= 1, prompt  # the first greedy token after the prompt is the same
            agree_total += agree
            positions += len(top_ref)
    finally:
        fp8.shutdown()
    assert agree_total >= 0.85 * positions
