"""DeepSeek-V4 on a CUDA GPU (GPU only), the tiny model of tiny_deepseek_v4.py with a byte-level
tokenizer (no bundled model needed): in float32 its logits match transformers' (CPU, float32) over
chunked prefill and decoding; in bfloat16 it stays as close to them as transformers' own bfloat16
run on the GPU; through the engine (JIT flags on, which DeepSeek-V4 runs without) batched greedy
tokens in float32 equal transformers' `generate`, and a bfloat16 runtime serves a batch and frees
every page."""

from __future__ import annotations

import pytest
import torch
from test_deepseek_v4 import Paged, check_bfloat16, reference, sequence
from test_deepseek_v4_engine import greedy
from tiny_deepseek_v4 import save_tiny_v4

import sgjit
from sgjit.runtime.tokenizer.byte_level import byte_level_tokenizer

from conftest import assert_no_leaked_pages

pytestmark = pytest.mark.gpu
VOCAB = 1024


@pytest.fixture(scope="module")
def tiny_gpu(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V4 to compare with")
    path = tmp_path_factory.mktemp("dsv4-gpu") / "tiny-v4"
    return path, save_tiny_v4(path, VOCAB, byte_level_tokenizer(VOCAB).backend)


def test_float32_on_cuda_matches_transformers(tiny_gpu):
    path, hf = tiny_gpu
    paged = Paged(path, page_size=8, device="cuda")
    tokens = sequence(50, 1, VOCAB)
    pages = paged.pages(50)
    steps = [(0, 13), (13, 16), (16, 30)] + [(p, p + 1) for p in range(30, 50)]
    ours = torch.cat([paged.step([(tokens, a, b, pages)])[0] for a, b in steps])
    assert (ours - reference(hf, tokens)).abs().max().item() < 1e-3


def test_bfloat16_on_cuda_tracks_transformers(tiny_gpu):
    check_bfloat16(*tiny_gpu, device="cuda", vocab=VOCAB)


def test_engine_on_cuda(tiny_gpu):
    path, hf = tiny_gpu
    prompts = [sequence(n, seed, VOCAB) for seed, n in enumerate((37, 5, 22, 61))]
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    common = dict(device="cuda", max_total_tokens=4096, chunked_prefill_size=16, enable_jit=True, seed=0)
    with sgjit.Runtime(str(path), dtype="float32", **common) as rt:
        outs = rt.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in outs] == [greedy(hf, ids) for ids in prompts]
        assert_no_leaked_pages(rt)
    with sgjit.Runtime(str(path), **common) as rt:
        assert rt.dtype == torch.bfloat16
        outs = rt.generate(input_ids=prompts, sampling_params=params)
        assert all(len(o["output_ids"]) == 10 for o in outs)
        assert_no_leaked_pages(rt)
