"""Roles rendered with the model's own chat template.

A program's text only grows, but a chat template renders whole conversations. The text a role adds
is therefore the template's own difference: render the messages so far, render them again with the
new message holding a sentinel as its content, and the part before the sentinel (beyond the first
rendering) opens the role, the part after it closes the role. Whatever the template adds once — a
default system prompt when the program has none, a BOS token — lands in the first role's opening.

`static_text` is the one rendering of the constant nodes (text and roles): the executor appends
what it returns as a program runs, and the JIT renders a plan's constant prefix with it at compile
time, so the two cannot drift."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sgjit.compiler.nodes import ConstText, Node, RoleBegin, RoleEnd
from sgjit.errors import ProgramError

_SENTINEL = "\x00sgjit-message-content\x00"

Render = Callable[[list[dict[str, str]]], str]  # messages -> template text, no generation prompt


@dataclass(slots=True)
class ChatTranscript:
    messages: list[dict[str, str]] = field(default_factory=list)  # closed messages
    role: str | None = None  # the open role
    content_start: int = 0  # where the open message's content begins in the program text
    closing: str = ""  # what the template puts after the open message's content
    used: bool = False  # the program's text is chat-template text (tokenize without adding BOS)

    def begin(self, role: str, render: Render, text_len: int) -> str:
        """Open `role` in a program whose text is `text_len` long; returns the text to append."""
        base = render(self.messages) if self.messages else ""
        framed = render([*self.messages, {"role": role, "content": _SENTINEL}])
        at = framed.find(_SENTINEL)
        if at < 0 or not framed.startswith(base):
            raise ProgramError(
                f"the model's chat template re-renders earlier messages when a {role} message follows, so a "
                "program cannot grow one message at a time; write the prompt text without roles instead"
            )
        header = framed[len(base) : at]
        self.role, self.closing, self.used = role, framed[at + len(_SENTINEL) :], True
        self.content_start = text_len + len(header)
        return header

    def end(self, text: str) -> str:
        """Close the open role of the program whose whole text is `text`; returns the text to append."""
        assert self.role is not None, "the program checker pairs every role end with a begin"
        self.messages.append({"role": self.role, "content": text[self.content_start :]})
        self.role = None
        return self.closing

    def snapshot(self, text: str) -> list[dict[str, str]]:
        """The OpenAI-style message list so far, the open message with its content up to now."""
        out = [dict(m) for m in self.messages]
        if self.role is not None:
            out.append({"role": self.role, "content": text[self.content_start :]})
        return out

    def copy(self) -> ChatTranscript:
        return ChatTranscript(
            [dict(m) for m in self.messages], self.role, self.content_start, self.closing, self.used
        )


STATIC_NODES = (ConstText, RoleBegin, RoleEnd)


def static_text(
    node: ConstText | RoleBegin | RoleEnd, chat: ChatTranscript, render: Render, text: str
) -> str:
    """The text a constant node appends to a program whose text so far is `text`."""
    if isinstance(node, ConstText):
        return node.text
    if isinstance(node, RoleBegin):
        return chat.begin(node.role, render, len(text))
    return chat.end(text)


def render_static(nodes: list[Node], render: Render) -> tuple[str, bool]:
    """The text constant `nodes` render to from an empty program, and whether its tokenization adds
    special tokens (not when it is chat-template text, which carries its own)."""
    chat, text = ChatTranscript(), ""
    for node in nodes:
        text += static_text(node, chat, render, text)  # type: ignore[arg-type]
    return text, not chat.used
