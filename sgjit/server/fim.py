"""Fill-in-the-middle prompts for text completions' `suffix`. A FIM-trained model marks the code
before and after the hole with its own special tokens; which spelling it uses is read from the
vocabulary, so any model trained in one of the known styles works without configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sgjit.errors import ModelCapabilityError

if TYPE_CHECKING:
    from sgjit.runtime.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The prompt is `open + prefix + between + suffix + close`; the model writes the middle."""

    style: str
    open: int
    between: int
    close: int


# (style, token before the prefix, between prefix and suffix, after the suffix), in the
# prefix-suffix-middle order each family was trained on.
FIM_STYLES: tuple[tuple[str, str, str, str], ...] = (
    ("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>"),
    ("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


def fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The model's FIM tokens, or None when its vocabulary has no complete set."""
    for style, *names in FIM_STYLES:
        ids = [tokenizer.backend.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            return FimTokens(style, *ids)  # type: ignore[arg-type]
    return None


def fim_prompt(tokenizer: Tokenizer, prefix: str, suffix: str) -> list[int]:
    """Token ids of a fill-in-the-middle prompt; a 400 when the model has no FIM tokens."""
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise ModelCapabilityError(
            "suffix needs a model trained for fill-in-the-middle, and this model's vocabulary has no "
            "fill-in-the-middle tokens (<fim_prefix>/<fim_suffix>/<fim_middle> or a known variant); "
            "leave suffix out, or serve a FIM code model",
            "suffix",
        )
    bos = [tokenizer.bos_token_id] if tokenizer.add_bos and tokenizer.bos_token_id is not None else []
    body = [fim.open, *tokenizer.encode(prefix, add_special_tokens=False), fim.between]
    return [*bos, *body, *tokenizer.encode(suffix, add_special_tokens=False), fim.close]
