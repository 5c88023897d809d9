"""The model's own Jinja chat template, rendered with jinja2 as Hugging Face does it."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sgjit.errors import InvalidRequestError, ModelFormatError


def _raise(message: str) -> None:
    raise InvalidRequestError(f"chat template rejected the messages: {message}", param="messages")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str | None, eos_token: str | None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ModelFormatError(f"the model's chat template does not parse: {e}") from e
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        try:
            return self.template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **kwargs,
            )
        except InvalidRequestError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError) as e:
            raise InvalidRequestError(
                f"chat template could not render the messages: {e}", param="messages"
            ) from e

    @staticmethod
    def fallback(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """ChatML, for models that ship no template."""
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
