"""Our tokenizer, built from the GGUF's own vocabulary with the `tokenizers` library, gives the same ids
as transformers' tokenizer from the same GGUF, and decode(encode(x)) == x."""

from __future__ import annotations

import pytest

TEXTS = [
    "Hello world",
    "  leading spaces,   inner runs\t\ttabs\n\n\nand newlines\r\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i] * 3.14159; }",
    "Numbers: 12345, 3.14159, 2024-01-01, 1e-9",
    "你好，世界！日本語のテキスト。한국어 문장입니다.",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "It's they're we'll I'd YOU'RE",
    "café naïve résumé Ærøskøbing",
    "<|endoftext|>after the special token",
    "     ",
    "x" * 100,
]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(runtime, hf_tokenizer, text):
    assert runtime.tokenizer.encode(text) == hf_tokenizer.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(runtime, text):
    assert runtime.tokenizer.decode(runtime.tokenizer.encode(text)) == text


def test_special_tokens_are_single_ids(runtime):
    ids = runtime.tokenizer.encode("<|im_start|>assistant<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert runtime.tokenizer.decode(ids[1:-1]) == "assistant"
    assert runtime.tokenizer.decode(ids, skip_special_tokens=True) == "assistant"


def test_chat_template_matches_transformers(runtime, hf_tokenizer):
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    ours = runtime.tokenizer.encode_chat(messages)
    theirs = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(theirs, dict) or hasattr(theirs, "keys"):
        theirs = theirs["input_ids"]
    assert ours == list(theirs)
    # The template's own default system prompt applies when the messages have none.
    assert "You are a helpful AI assistant" in runtime.tokenizer.apply_chat_template(messages)


def test_byte_alphabet_is_tokenizers_byte_level_alphabet():
    from tokenizers.pre_tokenizers import ByteLevel

    from sgjit.runtime.tokenizer.byte_level import byte_alphabet

    assert len(byte_alphabet()) == 256 and set(byte_alphabet()) == set(ByteLevel.alphabet())
