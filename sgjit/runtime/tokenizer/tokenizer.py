"""`Tokenizer`: a `tokenizers.Tokenizer` plus what the model's metadata says about special tokens,
BOS handling and the chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from sgjit.errors import ModelFormatError
from sgjit.runtime.text_input import check_text
from sgjit.runtime.tokenizer.chat_template import ChatTemplate


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos: bool,
        chat_template: str | None,
        pad_token_id: int | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.add_bos = add_bos
        self.chat_template = (
            ChatTemplate(chat_template, self.token_text(bos_token_id), self.eos_token_text)
            if chat_template
            else None
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_text(self) -> str | None:
        return self.token_text(self.eos_token_ids[0]) if self.eos_token_ids else None

    def token_text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token text in it (e.g. `<|im_start|>`) maps to its id; with
        `add_special_tokens`, BOS is prepended where the model asks for it."""
        ids = self.backend.encode(
            check_text(text, "the prompt", "prompt"), add_special_tokens=add_special_tokens
        ).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if self.chat_template is None:
            return ChatTemplate.fallback(messages, add_generation_prompt)
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_vars: Any
    ) -> list[int]:
        """`template_vars`: more variables for the template (e.g. `tools`)."""
        # The rendered template carries its own BOS where the model wants one.
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt, **template_vars),
            add_special_tokens=False,
        )

    @classmethod
    def from_hf_dir(cls, path: Path, config: dict[str, Any], eos_ids: Sequence[int]) -> Tokenizer:
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelFormatError(f"{path} has no tokenizer.json; sgjit needs the fast-tokenizer file")
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
        tcfg_file = path / "tokenizer_config.json"
        tcfg = json.loads(tcfg_file.read_text()) if tcfg_file.is_file() else {}
        template = tcfg.get("chat_template")
        jinja_file = path / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        if isinstance(template, list):  # named templates: take the default
            template = next(
                (t["template"] for t in template if t.get("name") == "default"), template[0]["template"]
            )

        def token_id(key: str) -> int | None:
            tok = tcfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            return backend.token_to_id(tok) if isinstance(tok, str) else None

        bos = token_id("bos_token")
        if bos is None:
            bos = config.get("bos_token_id")
        eos = list(eos_ids)
        tok_eos = token_id("eos_token")
        if tok_eos is not None and tok_eos not in eos:
            eos.append(tok_eos)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_ids=eos,
            add_bos=bool(tcfg.get("add_bos_token", False)),
            chat_template=template,
            pad_token_id=token_id("pad_token"),
        )
