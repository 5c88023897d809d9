"""Build a `tokenizers.Tokenizer` from the vocabulary a GGUF file carries (`tokenizer.ggml.*`), so GGUF
models need no tokenizer.json and no transformers. The split regexes are those each vocabulary's
merges were learned with, keyed by llama.cpp's `tokenizer.ggml.pre` names."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from sgjit.errors import UnsupportedModelError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_REGEXES = {
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "tekken": _TEKKEN,
}  # fmt: skip
# Vocabularies trained with each digit its own pre-token before GPT-2's byte-level split.
DIGIT_SPLIT = {"smollm", "starcoder", "refact"}


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in SPLIT_REGEXES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT_REGEXES[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    steps: list[pre_tokenizers.PreTokenizer] = []
    if pre in DIGIT_SPLIT:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    return pre_tokenizers.Sequence(steps)


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Sentencepiece files may omit merges: every split of a token into two vocabulary entries is a
    merge, ranked by the merged token's score."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, str, str]] = []
    for token, tid in vocab.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[tid], vocab[left], left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def tokenizer_from_gguf(
    model: str,
    tokens: Sequence[str],
    token_types: Sequence[int] | None,
    merges: Sequence[str] | None,
    scores: Sequence[float] | None,
    pre: str | None,
    add_space_prefix: bool = True,
) -> Tokenizer:
    """`model` is `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (sentencepiece BPE)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * len(tokens)
    if model == "gpt2":
        pairs = [tuple(m.split(" ", 1)) for m in merges or ()]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
    elif model == "llama":
        if merges:
            pairs = [tuple(m.split(" ", 1)) for m in merges]
        else:
            pairs = _merges_from_scores(tokens, scores or [0.0] * len(tokens))
        unk = next((t for t, ty in zip(tokens, types) if ty == TOKEN_UNKNOWN), None)
        tok = Tokenizer(
            models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
        )
        steps = [normalizers.Replace(" ", "\u2581")]
        if add_space_prefix:
            steps.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(steps)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else [])
        )
    else:
        raise UnsupportedModelError(
            f"GGUF tokenizer model {model!r} is not supported (gpt2 byte-level BPE and llama sentencepiece are)"
        )
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types)
        if ty == TOKEN_CONTROL and t
    ]
    tok.add_special_tokens(special)
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types)
        if ty == TOKEN_USER_DEFINED
    ]
    if user:
        tok.add_tokens(user)
    return tok
