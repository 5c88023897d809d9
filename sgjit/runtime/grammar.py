"""Constrained decoding through llguidance: `regex`, `json_schema`, `choices` (and Lark `ebnf`) become
token bitmasks on the logits. llguidance was chosen over xgrammar because it installs in seconds with
no further dependencies (xgrammar pulls transformers and triton, ~1 GB) and builds its token trie
straight from the `tokenizers` JSON we already have. Compiled grammars are cached by their text."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from functools import cached_property

import torch

from sgjit.errors import GrammarError
from sgjit.runtime.tokenizer import Tokenizer


def lark_for_choices(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c) for c in choices)


class GrammarCompiler:
    """Turns a constraint into a validated llguidance grammar and hands out matchers. Thread-safe:
    requests are validated on the caller's thread before anything reaches the engine."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...], cache_size: int = 256
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @cached_property
    def ll_tokenizer(self):
        import llguidance

        backend = self.tokenizer.backend
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids)

    def grammar(self, kind: str, text: str) -> str:
        key = (kind, text)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        grammar = self._build(kind, text)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar

    def _build(self, kind: str, text: str) -> str:
        import llguidance

        try:
            if kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(text)
            elif kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
            elif kind == "choices":
                grammar = llguidance.LLMatcher.grammar_from_lark(lark_for_choices(json.loads(text)))
            elif kind == "ebnf":
                grammar = llguidance.LLMatcher.grammar_from_lark(text)
            else:
                raise GrammarError(f"unknown constraint kind {kind!r}", kind)
        except ValueError as e:
            raise GrammarError(f"invalid {kind}: {e}", kind) from e
        error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error and not error.startswith("WARNING"):
            raise GrammarError(f"invalid {kind} ({error.strip()}); fix it and resend", kind)
        return grammar

    def matcher(self, kind: str, text: str) -> GrammarMatcher:
        import llguidance

        m = llguidance.LLMatcher(self.ll_tokenizer, self.grammar(kind, text), log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid {kind}: {m.get_error()}", kind)
        return GrammarMatcher(m, self.vocab_size)


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.m = matcher
        self.words = (vocab_size + 31) // 32

    def fill_bitmask(self, row: torch.Tensor) -> None:
        """Write the allowed-token bits into `row` (int32 [words], contiguous, on CPU)."""
        self.m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise GrammarError(f"token {token} violates the grammar: {self.m.get_error()}")

    def is_finished(self) -> bool:
        return self.m.is_stopped()
