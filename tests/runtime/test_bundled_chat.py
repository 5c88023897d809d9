from __future__ import annotations

from conftest import GREEDY


def test_capital_of_france(runtime):
    out = runtime.chat(
        [{"role": "user", "content": "What is the capital of France?"}], {**GREEDY, "max_new_tokens": 32}
    )
    assert "Paris" in out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert "<|im_end|>" not in out["text"]
