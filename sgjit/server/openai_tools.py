"""OpenAI tool calling, request side: check `tools` / `tool_choice`, put the tools and the
conversation's earlier calls and results in front of the model, and — for `required` or a named
function — a grammar so that the answer is a valid call whatever the model's size.

Templates with a tools section (Qwen, Llama 3.1, Mistral, DeepSeek, ...) get the tools as the
`tools` variable and the messages in Hugging Face's layout (`tool_calls` with `arguments` as an
object, `tool` messages with `tool_call_id`). A template without one (SmolLM2's plain ChatML) gets
the Hermes layout spelled out: the tools and how to call them in the system message, earlier calls
as `<tool_call>` blocks, results as `<tool_response>` blocks in a user turn."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sgjit.errors import ConflictingParamsError
from sgjit.server.tool_formats import ParsedCall, ToolFormat, ToolSpec, split_calls, tool_format

if TYPE_CHECKING:
    from sgjit.runtime.tokenizer import Tokenizer
    from sgjit.server.protocol import ChatCompletionRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}

TOOLS_PREAMBLE = (
    "You can call functions to help with the user's request. These are the functions, each "
    "described by a JSON object inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with a <tool_call></tool_call> block holding a JSON object with the "
    'function\'s "name" and its "arguments", one block per call:\n'
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<the arguments>}}}}\n</tool_call>'
)


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """What a request's tools mean for its answer: the format it is read in and whether a call is
    free (`auto`), or forced (`required`: some tool, `named`: the one in `specs`)."""

    fmt: ToolFormat
    mode: Literal["auto", "required", "named"]
    specs: tuple[ToolSpec, ...]
    parallel: bool
    eos_texts: tuple[str, ...] = ()  # with special markers the text keeps special tokens: EOS is cut

    def read(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """A finished answer as (content, calls); content None when there are calls and no text."""
        for eos in self.eos_texts:
            text = text.removesuffix(eos)
        content, calls = split_calls(self.fmt, text)
        return (content or None) if calls else content, calls


def tool_setup(body: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> ToolSetup | None:
    """None when the answer is plain text: no tools, or `tool_choice: "none"`."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise ConflictingParamsError(
                "tool_choice needs tools: list the functions in tools", "tool_choice"
            )
        return None
    if choice == "none":
        return None
    specs = [ToolSpec(t.function.name, t.function.parameters or ANY_OBJECT) for t in body.tools]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConflictingParamsError("two tools have the same function name; give each its own", "tools")
    template = tokenizer.chat_template.source if tokenizer.chat_template else None
    fmt = tool_format(parser, template)
    parallel = body.parallel_tool_calls is not False
    eos = tuple(t for i in tokenizer.eos_token_ids if fmt.special_markers and (t := tokenizer.token_text(i)))
    if choice in (None, "auto"):
        return ToolSetup(fmt, "auto", tuple(specs), parallel, eos)
    if choice == "required":
        return ToolSetup(fmt, "required", tuple(specs), parallel, eos)
    wanted = choice.function.name  # type: ignore[union-attr]
    if wanted not in names:
        raise ConflictingParamsError(
            f"tool_choice names the function {wanted!r}, which is not in tools ({', '.join(names)})",
            "tool_choice.function.name",
        )
    return ToolSetup(fmt, "named", tuple(s for s in specs if s.name == wanted), False, eos)


def tool_constraint(setup: ToolSetup | None, tokenizer: Tokenizer) -> dict[str, Any]:
    """`SamplingParams` keys that force a call (`required`, named), else none."""
    if setup is None or setup.mode == "auto":
        return {}
    return {"ebnf": setup.fmt.grammar(setup.specs, setup.parallel, _marker_ref(tokenizer))}


def _marker_ref(tokenizer: Tokenizer):
    """A marker that is one special token is matched as that token (`<[id]>`); other markers as text."""

    def ref(marker: str) -> str:
        token = tokenizer.backend.token_to_id(marker)
        if token is not None and token in tokenizer.special_token_ids:
            return f"<[{token}]>"
        return json.dumps(marker)

    return ref


def render_inputs(
    messages: list[dict[str, Any]], body: ChatCompletionRequest, tokenizer: Tokenizer, offer_tools: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages and extra template variables for the model's template. `offer_tools`: the tools
    go into the prompt (not with `tool_choice: "none"`)."""
    template = tokenizer.chat_template.source if tokenizer.chat_template else ""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []] if offer_tools else []
    if "tools" in template or "tool_calls" in template:
        return messages, ({"tools": tools} if tools else {})
    return _hermes_messages(messages, tools), {}


def _hermes_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block  # results of parallel calls share one turn
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        elif m.get("tool_calls"):
            calls = [
                f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']}, ensure_ascii=False)}\n</tool_call>"
                for c in m["tool_calls"]
            ]
            out.append(
                {"role": "assistant", "content": "\n".join(filter(None, [m.get("content") or "", *calls]))}
            )
        else:
            out.append({"role": m["role"], "content": m["content"]})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        preamble = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out
