"""Reasoning parsers: the thinking block of models that think aloud (`<think>...</think>`, as
DeepSeek-R1 and Qwen3 write it) goes to `reasoning_content`, the rest to `content`. The splitter
is incremental so streamed deltas split the same way as a whole text; a partial tag at the end of
a delta is held back until the next delta shows whether it is a tag."""

from __future__ import annotations

from dataclasses import dataclass

THINK_START, THINK_END = "<think>", "</think>"
# parser name -> whether text before any `<think>` is reasoning. DeepSeek-R1's template opens the
# block in the generation prompt, so its output starts inside it; Qwen3 writes `<think>` itself
# (and with thinking switched off, writes none: then it is all content).
REASONING_PARSERS: dict[str, bool] = {"deepseek-r1": True, "qwen3": False}


def template_thinks(template_source: str | None) -> bool:
    """Whether a chat template knows thinking tags (the parser to use when none is configured)."""
    return bool(template_source) and THINK_END in (template_source or "")


def default_parser(template_source: str | None) -> str | None:
    """The parser a template implies: DeepSeek-R1's when the template itself opens the block for
    the model's turn (`...<think>\\n'` ends a string literal there), else Qwen3's."""
    if not template_source or not template_thinks(template_source):
        return None
    return "deepseek-r1" if "<think>\\n'" in template_source else "qwen3"


@dataclass(slots=True)
class ReasoningSplitter:
    starts_in_reasoning: bool
    _state: str = "start"  # start (nothing decided yet) | reasoning | content
    _held: str = ""

    @classmethod
    def named(cls, parser: str) -> ReasoningSplitter:
        return cls(REASONING_PARSERS[parser])

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of this delta; either may be empty."""
        reasoning, content = [], []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._state == "start":
                stripped = buf.lstrip()
                if stripped.startswith(THINK_START):
                    buf, self._state = stripped[len(THINK_START) :], "reasoning"
                elif THINK_START.startswith(stripped):  # maybe the opening tag, not complete yet
                    self._held = buf
                    break
                else:
                    self._state = "reasoning" if self.starts_in_reasoning else "content"
            elif self._state == "reasoning":
                end = buf.find(THINK_END)
                if end >= 0:
                    reasoning.append(buf[:end])
                    buf, self._state = buf[end + len(THINK_END) :], "content"
                    continue
                keep = _partial_tag(buf, THINK_END)
                reasoning.append(buf[: len(buf) - keep])
                self._held = buf[len(buf) - keep :]
                break
            else:
                content.append(buf)
                break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """What was held back, at the end of the text."""
        held, self._held = self._held, ""
        if self._state == "reasoning" or (self._state == "start" and self.starts_in_reasoning):
            return held, ""
        return "", held

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole text as (reasoning_content or None, content)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.flush()
        return (r1 + r2) or None, c1 + c2


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
