"""Text a request hands to the runtime (prompts, chat content, stop strings, regexes, schemas) must
be plain Unicode: JSON can carry a NUL or a lone UTF-16 surrogate (`\\u0000`, `\\ud800`), which no
model was trained on, the tokenizer cannot encode (a surrogate) and C libraries read as the end of
the string (a NUL, e.g. in the grammar compiler). Refused at the door with the position."""

from __future__ import annotations

import re

from sgjit.errors import InvalidRequestError

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def check_text(text: str, what: str, param: str) -> str:
    """`text` unchanged, or `InvalidRequestError` naming `what` and where the bad character is."""
    bad = _BAD_CHAR.search(text)
    if bad is not None:
        char = (
            "a NUL character (\\u0000)"
            if bad.group() == "\x00"
            else f"a lone surrogate (\\u{ord(bad.group()):04x})"
        )
        raise InvalidRequestError(
            f"{what} contains {char} at character {bad.start()}; send valid Unicode text without NULs "
            "or unpaired surrogates",
            param,
        )
    return text
