"""How models write tool calls, one `ToolFormat` per family: where a call starts in the generated
text, how the calls are read back out of it, and a Lark grammar (llguidance's dialect, with `%json`
for the arguments) that forces a model to write valid calls when the client requires one.

- `hermes` (Hermes, Qwen2/2.5/3, and the default for ChatML templates without a tools section):
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call.
- `llama3_json` (Llama 3.1+): the answer is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`), several separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer
  `[TOOL_CALLS]name[ARGS]{...}`.
- `deepseek_v3` (DeepSeek V3/R1, V3.1+): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`
  then the arguments in a ```json fence (V3.1+: `NAME<｜tool▁sep｜>{...}`), `<｜tool▁call▁end｜>` per call."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sgjit.errors import InvalidRequestError

# A marker as a grammar writes it: `<[id]>` for a special token, else a quoted literal.
MarkerRef = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's `function.arguments`


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function a request offers: its name and the JSON schema of its arguments."""

    name: str
    parameters: dict[str, Any]


def _decode_object(text: str, start: int = 0) -> tuple[dict[str, Any] | None, int]:
    """The JSON object at `text[start:]` (after whitespace) and where it ends; (None, start) if
    there is none, or not yet a whole one."""
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    try:
        value, end = json.JSONDecoder().raw_decode(text, i)
    except json.JSONDecodeError:
        return None, start
    return (value, end) if isinstance(value, dict) else (None, start)


def _call(obj: dict[str, Any] | None, args_key: str = "arguments") -> ParsedCall | None:
    if not obj or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


# llguidance's JSON options: compact separators, so a forced call cannot wander off in whitespace.
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {**schema, "x-guidance": COMPACT}


def closed(parameters: dict[str, Any]) -> dict[str, Any]:
    """An object schema that leaves `additionalProperties` open, closed: a forced call then holds
    the arguments the function declares and no others (narrower, so still valid for the schema)."""
    if (
        parameters.get("type") == "object"
        and "properties" in parameters
        and "additionalProperties" not in parameters
    ):
        return {**parameters, "additionalProperties": False}
    return parameters


def _named_object(name: str, name_key: str, args_key: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name_key: {"const": name}, args_key: closed(parameters)},
        "required": [name_key, args_key],
        "additionalProperties": False,
    }


class ToolFormat:
    name: str = ""
    markers: tuple[str, ...] = ()  # text that starts the calls
    special_markers: bool = False  # markers are special tokens: the text must keep them

    def start(self, text: str) -> int:
        """Index where the calls begin in `text`, or -1."""
        found = [i for m in self.markers if (i := text.find(m)) >= 0]
        return min(found) if found else -1

    def holdback(self, text: str) -> int:
        """How many trailing characters of `text` could be the beginning of a marker (a stream
        holds them back until it knows)."""
        best = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), best, -1):
                if m.startswith(text[-k:]):
                    best = k
                    break
        return best

    def calls(self, segment: str, final: bool) -> list[ParsedCall]:
        """The whole calls in `segment` (which begins at `start`); `final`: the text is complete."""
        raise NotImplementedError

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, ref: MarkerRef) -> str:
        """Lark for an answer that is nothing but one call (or, with `parallel`, one or more)."""
        raise NotImplementedError


class Hermes(ToolFormat):
    name = "hermes"
    markers = ("<tool_call>",)
    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def calls(self, segment: str, final: bool) -> list[ParsedCall]:
        bodies = [m.group(1) for m in self.BLOCK.finditer(segment)]
        tail = segment.rfind("<tool_call>")
        if final and tail >= 0 and "</tool_call>" not in segment[tail:]:
            bodies.append(segment[tail + len("<tool_call>") :])  # cut off by max_tokens or EOS
        return [c for b in bodies if (c := _call(_decode_object(b)[0]))]

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, ref: MarkerRef) -> str:
        schema = _one_of([_named_object(t.name, "name", "arguments", t.parameters) for t in tools])
        return "\n".join(
            [
                "start: call" + (' ("\\n" call)*' if parallel else ""),
                f'call: {ref("<tool_call>")} "\\n" %json {json.dumps(schema)} "\\n" {ref("</tool_call>")}',
            ]
        )


class Llama3Json(ToolFormat):
    name = "llama3_json"
    markers = ("<|python_tag|>",)  # or a `{` that opens the answer (see `start`)
    special_markers = True

    def start(self, text: str) -> int:
        tag = text.find("<|python_tag|>")
        if tag >= 0:
            return tag
        stripped = len(text) - len(text.lstrip())
        return stripped if text[stripped:].startswith("{") else -1  # a bare call is the whole answer

    def calls(self, segment: str, final: bool) -> list[ParsedCall]:
        i = len("<|python_tag|>") if segment.startswith("<|python_tag|>") else 0
        out = []
        while True:
            obj, end = _decode_object(segment, i)
            if obj is None or (call := _call(obj, "parameters")) is None:
                return out
            out.append(call)
            i = end
            while i < len(segment) and (segment[i].isspace() or segment[i] == ";"):
                i += 1

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, ref: MarkerRef) -> str:
        schema = _one_of([_named_object(t.name, "name", "parameters", t.parameters) for t in tools])
        return "\n".join(
            ["start: call" + (' ("; " call)*' if parallel else ""), f"call: %json {json.dumps(schema)}"]
        )


class Mistral(ToolFormat):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    special_markers = True

    def calls(self, segment: str, final: bool) -> list[ParsedCall]:
        body = segment[len("[TOOL_CALLS]") :]
        if body.lstrip().startswith("["):  # [TOOL_CALLS][{...}, ...]
            try:
                value, _ = json.JSONDecoder().raw_decode(body.lstrip())
            except json.JSONDecodeError:
                return []
            return (
                [c for obj in value if isinstance(obj, dict) and (c := _call(obj))]
                if isinstance(value, list)
                else []
            )
        out = []  # [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name2[ARGS]{...}
        for part in body.split("[TOOL_CALLS]"):
            name, sep, rest = part.partition("[ARGS]")
            obj = _decode_object(rest)[0] if sep else None
            if obj is not None and name.strip():
                out.append(ParsedCall(name.strip(), json.dumps(obj, ensure_ascii=False)))
        return out

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, ref: MarkerRef) -> str:
        item = _one_of([_named_object(t.name, "name", "arguments", t.parameters) for t in tools])
        array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        return f"start: {ref('[TOOL_CALLS]')} %json {json.dumps(array)}"


class DeepSeekV3(ToolFormat):
    name = "deepseek_v3"
    markers = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
    special_markers = True
    CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
    FENCED = re.compile(r"^(?:function)?<｜tool▁sep｜>(.*?)\n```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

    def calls(self, segment: str, final: bool) -> list[ParsedCall]:
        out = []
        for m in self.CALL.finditer(segment):
            inner = m.group(1)
            if fenced := self.FENCED.match(inner):  # V3: function<sep>NAME\n```json\n{...}\n```
                name, args = fenced.group(1), fenced.group(2)
            else:  # V3.1+: NAME<sep>{...}
                name, _, args = inner.partition("<｜tool▁sep｜>")
            obj = _decode_object(args)[0]
            if obj is not None and name.strip():
                out.append(ParsedCall(name.strip(), json.dumps(obj, ensure_ascii=False)))
        return out

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, ref: MarkerRef) -> str:
        lines = [
            f"start: {ref('<｜tool▁calls▁begin｜>')} call{'+' if parallel else ''} {ref('<｜tool▁calls▁end｜>')}",
            "call: " + " | ".join(f"call_{k}" for k in range(len(tools))),
        ]
        for k, t in enumerate(tools):
            head = f'{ref("<｜tool▁call▁begin｜>")} "function" {ref("<｜tool▁sep｜>")} {json.dumps(t.name)}'
            lines.append(
                f'call_{k}: {head} "\\n```json\\n" %json {json.dumps({**closed(t.parameters), "x-guidance": COMPACT})} "\\n```" {ref("<｜tool▁call▁end｜>")}'
            )
        return "\n".join(lines)


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (Hermes(), Llama3Json(), Mistral(), DeepSeekV3())}
# Other servers' names for the same formats (SGLang's --tool-call-parser values).
ALIASES = {"qwen": "hermes", "qwen25": "hermes", "qwen3": "hermes", "llama3": "llama3_json",
           "deepseekv3": "deepseek_v3", "deepseekv31": "deepseek_v3"}  # fmt: skip
PARSER_CHOICES = ("auto", *FORMATS, *ALIASES)


def tool_format(parser: str, template_source: str | None) -> ToolFormat:
    """The format named by `--tool-call-parser`, or (`auto`) the one the chat template writes; a
    template that shows none (e.g. SmolLM2's plain ChatML) gets `hermes`, which sgjit then describes
    to the model in the system prompt."""
    if parser != "auto":
        name = ALIASES.get(parser, parser)
        if name not in FORMATS:
            raise InvalidRequestError(
                f"unknown tool-call parser {parser!r}; choose one of {', '.join(PARSER_CHOICES)}",
                "tool_call_parser",
            )
        return FORMATS[name]
    source = template_source or ""
    for marker, name in (("[TOOL_CALLS]", "mistral"), ("tool▁calls▁begin", "deepseek_v3"),
                         ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json")):  # fmt: skip
        if marker in source:
            return FORMATS[name]
    return FORMATS["hermes"]


def split_calls(fmt: ToolFormat, text: str) -> tuple[str, list[ParsedCall]]:
    """A finished answer as (content before the calls, the calls); text with no readable call is
    all content, so nothing the model wrote is lost."""
    start = fmt.start(text)
    if start < 0:
        return text, []
    calls = fmt.calls(text[start:], final=True)
    if not calls:
        return text, []
    return text[:start].rstrip(), calls


class ToolCallStream:
    """Splits a streamed answer into content deltas and whole tool calls: content is passed on
    except for a tail that could begin a marker; from the first marker on, text is buffered and
    each call is handed out once it is complete (OpenAI's clients accumulate `tool_calls` deltas,
    so one delta per call is valid)."""

    def __init__(self, fmt: ToolFormat, eos_texts: tuple[str, ...] = ()) -> None:
        self.fmt = fmt
        self.eos_texts = eos_texts  # cut from the end before the last read (text that keeps special tokens)
        self.text = ""
        self.content_sent = 0
        self.start = -1
        self.calls_sent = 0

    def feed(self, delta: str) -> tuple[str, list[ParsedCall]]:
        self.text += delta
        if self.start < 0:
            self.start = self.fmt.start(self.text)
        if self.start < 0:
            end = len(self.text) - self.fmt.holdback(self.text)
            while end > self.content_sent and self.text[end - 1].isspace():
                end -= 1  # whitespace before a call is dropped, as `split_calls` does
            return self._content(end), []
        content = self._content(len(self.text[: self.start].rstrip()))
        return content, self._new_calls(self.fmt.calls(self.text[self.start :], final=False))

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """What is left once generation has ended."""
        for eos in self.eos_texts:
            self.text = self.text.removesuffix(eos)
        if self.start < 0:
            return self._content(len(self.text)), []
        calls = self.fmt.calls(self.text[self.start :], final=True)
        if not calls:  # the marker led to no readable call: it was content after all
            return self._content(len(self.text)), []
        return self._content(len(self.text[: self.start].rstrip())), self._new_calls(calls)

    @property
    def made_calls(self) -> bool:
        return self.calls_sent > 0

    def _content(self, end: int) -> str:
        if end <= self.content_sent:
            return ""
        out = self.text[self.content_sent : end]
        self.content_sent = end
        return out

    def _new_calls(self, calls: list[ParsedCall]) -> list[ParsedCall]:
        new = calls[self.calls_sent :]
        self.calls_sent = len(calls)
        return new
