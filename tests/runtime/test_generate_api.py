"""`Runtime.generate` / `chat` follow SGLang's shapes: single and batch, logprobs, streaming."""

from __future__ import annotations

import subprocess
import sys

from conftest import GREEDY, assert_no_leaked_pages


def test_result_shape(runtime):
    out = runtime.generate("The capital of France is", {**GREEDY, "max_new_tokens": 5, "ignore_eos": True})
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 5 == len(out["output_ids"])
    assert meta["prompt_tokens"] == len(runtime.tokenizer.encode("The capital of France is"))
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert out["text"] == runtime.tokenizer.decode(out["output_ids"])


def test_batch_of_prompts_returns_a_list_in_order(runtime):
    prompts = ["One, two, three,", "A, B, C,", "Monday, Tuesday,"]
    outs = runtime.generate(prompts, {**GREEDY, "max_new_tokens": 6})
    assert isinstance(outs, list) and len(outs) == 3
    for p, o in zip(prompts, outs):
        assert o["text"] == runtime.generate(p, {**GREEDY, "max_new_tokens": 6})["text"]


def test_input_ids_batch(runtime):
    ids = [runtime.tokenizer.encode("Hello"), runtime.tokenizer.encode("Bonjour")]
    outs = runtime.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 3})
    assert len(outs) == 2 and all(o["meta_info"]["prompt_tokens"] == len(i) for o, i in zip(outs, ids))


def test_logprob_start_len_and_text(runtime):
    ids = runtime.tokenizer.encode("Paris is the capital of France.")
    out = runtime.generate(
        input_ids=ids,
        sampling_params={**GREEDY, "max_new_tokens": 2},
        return_logprob=True,
        logprob_start_len=3,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    inp = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in inp] == ids[3:]
    assert all(isinstance(e[0], float) and e[0] <= 0 for e in inp)
    assert inp[0][2] == runtime.tokenizer.decode([ids[3]])
    assert len(out["meta_info"]["input_top_logprobs"]) == len(inp)
    assert len(out["meta_info"]["output_token_logprobs"]) == 2


def test_stream_chunks_are_whole_utf8_and_add_up(runtime):
    params = {**GREEDY, "max_new_tokens": 40, "ignore_eos": True}
    prompt = "Translate to Chinese and add emoji: I love the sea. 我爱"
    full = runtime.generate(prompt, params)
    chunks = list(runtime.generate(prompt, params, stream=True))
    texts = [c["text"] for c in chunks]
    assert chunks[-1]["finished"] and chunks[-1]["meta_info"]["completion_tokens"] == 40
    for t in texts:
        assert "\ufffd" not in t
        t.encode("utf-8")  # no lone surrogates
    assert "".join(texts) == full["text"]
    assert any(ord(ch) > 0x2E80 for ch in full["text"])  # the test really crossed multi-byte text


def test_stop_string_is_trimmed(runtime):
    out = runtime.generate("1, 2, 3, 4, 5,", {**GREEDY, "max_new_tokens": 30, "stop": [" 8"]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 8"}
    assert out["text"].endswith("7,") and " 8" not in out["text"]


def test_max_new_tokens_zero_scores_the_prompt(runtime):
    ids = runtime.tokenizer.encode("Hello there")
    out = runtime.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0
    )
    assert out["output_ids"] == [] and out["text"] == ""
    assert len(out["meta_info"]["input_token_logprobs"]) == len(ids)
    assert_no_leaked_pages(runtime)


def test_generate_cli():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sgjit.generate",
            "The capital of France is",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "decode" in proc.stderr and "tok/s" in proc.stderr and "load" in proc.stderr


def test_profile_writes_a_chrome_trace(runtime, tmp_path):
    import json

    with runtime.profile(tmp_path, "window"):
        runtime.generate("Hello", {**GREEDY, "max_new_tokens": 4})
    trace = json.loads((tmp_path / "window.trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("linear" in n or "mm" in n for n in names)  # the engine thread's ops are in it
