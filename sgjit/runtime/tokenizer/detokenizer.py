"""Incremental detokenization that never splits a multi-byte character: text is released only once
the tokens decoded so far no longer end in an incomplete UTF-8 sequence."""

from __future__ import annotations

from sgjit.runtime.tokenizer.tokenizer import Tokenizer

_WINDOW = 6  # tokens of left context re-decoded so merges at the boundary (e.g. leading spaces) are right


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # released so far
        self._prefix = 0  # start of the context window
        self._read = 0  # ids up to here are reflected in `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the newly released text (possibly empty)."""
        self.ids.extend(token_ids)
        context = self._decode(self.ids[self._prefix : self._read])
        full = self._decode(self.ids[self._prefix :])
        if full.endswith("\ufffd") or len(full) < len(context):
            return ""
        delta = full[len(context) :]
        self.text += delta
        self._read = len(self.ids)
        self._prefix = max(0, self._read - _WINDOW)
        return delta

    def flush(self) -> str:
        """At the end: release whatever is left, replacement characters included."""
        if self._read == len(self.ids):
            return ""
        context = self._decode(self.ids[self._prefix : self._read])
        delta = self._decode(self.ids[self._prefix :])[len(context) :]
        self.text += delta
        self._read = len(self.ids)
        return delta
