"""/openapi.json states the server's own per-request caps, so a client (or a fuzzer) reading the
document knows which values the server answers 400 to, and the request models accept what JSON
Schema calls an integer."""

from __future__ import annotations

import pytest

from sgjit.server.app import create_app
from sgjit.server.args import ServerArgs
from sgjit.server.protocol import ChatCompletionRequest


def _props(args: ServerArgs, model: str) -> dict:
    return create_app(args).openapi()["components"]["schemas"][model]["properties"]


def _branch(prop: dict, kind: str) -> dict:
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") == kind)


@pytest.mark.parametrize("model", ["ChatCompletionRequest", "CompletionRequest"])
def test_document_states_the_configured_caps(model):
    args = ServerArgs(port=0, max_n=7, max_stop_strings=3, max_stop_length=11, max_stop_token_ids=5)
    props = _props(args, model)
    assert props["n"]["maximum"] == 7
    stop = props["stop"]
    assert _branch(stop, "string")["maxLength"] == 11
    assert _branch(stop, "array")["maxItems"] == 3 and _branch(stop, "array")["items"]["maxLength"] == 11
    assert _branch(props["stop_token_ids"], "array")["maxItems"] == 5


def test_top_logprobs_caps_take_the_smaller_limit():
    assert (
        _props(ServerArgs(port=0, max_top_logprobs=4), "GenerateRequest")["top_logprobs_num"]["maximum"] == 4
    )
    chat = _props(ServerArgs(port=0, max_top_logprobs=100), "ChatCompletionRequest")
    assert _branch(chat["top_logprobs"], "integer")["maximum"] == 20  # OpenAI's own limit stays


def test_json_schema_integers_are_integers():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate({**body, "n": 3.0}).n == 3
    for bad in (3.5, True, "3"):
        with pytest.raises(ValueError):
            ChatCompletionRequest.model_validate({**body, "n": bad})
