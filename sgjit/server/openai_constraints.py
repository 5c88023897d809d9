"""Structured output on OpenAI requests, from every spelling clients use: OpenAI's `response_format`
(with vLLM's / SGLang's `schema` inside `json_object`), SGLang's `regex` / `json_schema` / `ebnf`
extras, vLLM's `guided_*` fields and its newer `structured_outputs`. Each becomes one
`SamplingParams` constraint; two at once, or a key sgjit cannot honour, is a 400 naming it — a
constraint is never silently dropped, since the client would then parse unconstrained text."""

from __future__ import annotations

from typing import Any

from sgjit.errors import ConflictingParamsError, InvalidRequestError
from sgjit.server.protocol import ChatCompletionRequest, JsonObjectFormat, JsonSchemaFormat, OpenAISampling

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
# OpenAI chat fields that change what the model returns and that this server cannot honour.
UNSUPPORTED_CHAT_FIELDS = ("audio", "prediction", "web_search_options")


def output_constraint(body: OpenAISampling) -> dict[str, Any]:
    """The request's one constraint as `SamplingParams` keys (`{}` when unconstrained)."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        found.append(("response_format", _response_format(body)))
    for name, key in (("regex", "regex"), ("json_schema", "json_schema"), ("ebnf", "ebnf")):
        if getattr(body, name) is not None:
            found.append((name, {key: getattr(body, name)}))
    if body.guided_whitespace_pattern is not None:
        raise InvalidRequestError(
            "guided_whitespace_pattern is not supported (llguidance decides JSON whitespace); leave it out",
            "guided_whitespace_pattern",
        )
    for name, key in (
        ("guided_json", "json_schema"),
        ("guided_regex", "regex"),
        ("guided_choice", "choices"),
        ("guided_grammar", "ebnf"),
    ):
        if (value := getattr(body, name)) is not None:
            found.append((name, {key: _grammar(value, name) if key == "ebnf" else value}))
    if body.structured_outputs is not None:
        found.extend(_structured_outputs(body))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise ConflictingParamsError(f"{names} each constrain the output; give only one", found[1][0])
    return found[0][1] if found else {}


def _response_format(body: OpenAISampling) -> dict[str, Any]:
    fmt = body.response_format
    assert fmt is not None
    if isinstance(fmt, JsonObjectFormat):
        return {"json_schema": fmt.schema_ or ANY_JSON_OBJECT}
    assert isinstance(fmt, JsonSchemaFormat)
    return {"json_schema": fmt.json_schema.schema_ or ANY_JSON_OBJECT}


def _structured_outputs(body: OpenAISampling) -> list[tuple[str, dict[str, Any]]]:
    so = body.structured_outputs
    assert so is not None
    unknown = sorted(so.model_extra or {})
    if unknown:
        raise InvalidRequestError(
            f"structured_outputs key(s) {unknown} are not supported; use one of {list(STRUCTURED_OUTPUT_KEYS)}",
            f"structured_outputs.{unknown[0]}",
        )
    out = []
    if so.json_ is not None:
        out.append(("structured_outputs.json", {"json_schema": so.json_}))
    if so.regex is not None:
        out.append(("structured_outputs.regex", {"regex": so.regex}))
    if so.choice is not None:
        out.append(("structured_outputs.choice", {"choices": so.choice}))
    if so.grammar is not None:
        out.append(
            ("structured_outputs.grammar", {"ebnf": _grammar(so.grammar, "structured_outputs.grammar")})
        )
    if so.json_object:
        out.append(("structured_outputs.json_object", {"json_schema": ANY_JSON_OBJECT}))
    return out


def _grammar(text: str, param: str) -> str:
    """llguidance takes Lark. GBNF / EBNF (`rule ::= ...`, what xgrammar and llama.cpp take) would
    only fail later with a parse error that does not say why, so it is refused here by name."""
    if "::=" in text:
        raise InvalidRequestError(
            f"{param}: GBNF/EBNF grammars (rule ::= ...) are not supported; write the grammar in Lark "
            "(rule: ..., with a `start` rule), the dialect llguidance takes",
            param,
        )
    return text


def check_unsupported_chat_fields(body: ChatCompletionRequest) -> None:
    """Known OpenAI fields that would change the output if honoured: a 400 naming them."""
    named = [name for name in UNSUPPORTED_CHAT_FIELDS if getattr(body, name) is not None]
    if body.modalities is not None and set(body.modalities) - {"text"}:
        named.append("modalities")
    if named:
        verb, pronoun = ("is", "it") if len(named) == 1 else ("are", "them")
        raise InvalidRequestError(
            f"{', '.join(named)} {verb} not supported by this server (text output only); leave {pronoun} out",
            named[0],
        )
