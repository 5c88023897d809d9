"""Tokenization through the `tokenizers` library, chat templates through jinja2."""

from sgjit.runtime.tokenizer.detokenizer import IncrementalDetokenizer
from sgjit.runtime.tokenizer.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer"]
