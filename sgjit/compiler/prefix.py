"""A plan's constant prefix, tokenized once. The tokens of `prefix + anything` are the prefix's
tokens up to a stable point, then the tokens of the rest: BPE merges never reach far across a
pre-tokenizer boundary, so only the prefix's last few tokens can change with what follows. The
stable point is found once and checked against probe continuations; where no point passes, nothing
is reused and every step tokenizes the whole text (always correct, only slower)."""

from __future__ import annotations

from dataclasses import dataclass

from sgjit.runtime.tokenizer import Tokenizer

# Continuations a program argument could start with: letters that extend a word, spaces, digits,
# punctuation, newlines, multi-byte text, a special token.
PROBES = (
    "",
    " ",
    "a",
    "s",
    "ing",
    " a",
    "A",
    "1",
    "\n",
    "\n\n",
    ".",
    ",",
    ":",
    "é",
    "的",
    "😀",
    "  x",
    "<|im_end|>",
)


@dataclass(frozen=True, slots=True)
class PrefixTokens:
    text: str
    add_special: bool
    ids: list[int]  # tokenize(text)
    stable: int  # ids[:stable] start the tokens of text + anything
    cut: int  # characters of text those stable tokens cover

    def encode(self, tokenizer: Tokenizer, text: str) -> list[int] | None:
        """Tokens of `text` reusing the prefix's, or None when `text` does not start with the prefix."""
        if self.stable == 0 or not text.startswith(self.text):
            return None
        return self.ids[: self.stable] + tokenizer.encode(text[self.cut :], add_special_tokens=False)

    def as_dict(self) -> dict:
        return {"add_special": self.add_special, "ids": self.ids, "stable": self.stable, "cut": self.cut}


def stable_prefix(tokenizer: Tokenizer, text: str, add_special: bool) -> PrefixTokens:
    ids = tokenizer.encode(text, add_special_tokens=add_special)
    raw = tokenizer.backend.encode(text, add_special_tokens=add_special)
    extra = len(ids) - len(raw.ids)  # a BOS sgjit prepended itself
    for back in (1, 2, 3, 4, 6, 8):
        k = len(raw.ids) - back
        if k <= 0:
            break
        cut = raw.offsets[k - 1][1]
        stable = ids[: extra + k]
        if all(
            tokenizer.encode(text + p, add_special_tokens=add_special)
            == stable + tokenizer.encode(text[cut:] + p, add_special_tokens=False)
            for p in PROBES
        ):
            return PrefixTokens(text, add_special, ids, extra + k, cut)
    return PrefixTokens(text, add_special, ids, 0, 0)
