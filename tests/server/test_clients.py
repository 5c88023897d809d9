"""Clients nobody here wrote, unchanged, against the server on the bundled model: langchain-openai
(`invoke`, `stream`, `batch`, `bind_tools`, `with_structured_output`) and litellm. Each test is
skipped only when its package is not installed (CI installs both)."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no download at import

MODEL = "smollm2-135m"


class Weather(BaseModel):
    """Get the current weather of a city."""

    city: str = Field(max_length=20, description="the city")
    unit: str = Field(pattern="^[cf]$", description="c or f")


@pytest.fixture(scope="module")
def chat_model(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key="unused",
        temperature=0,
        max_tokens=12,
        max_retries=0,
    )


def test_langchain_invoke_stream_and_batch_agree(chat_model):
    question = "Name a colour."
    whole = chat_model.invoke(question)
    assert isinstance(whole.content, str) and whole.content
    streamed = "".join(chunk.content for chunk in chat_model.stream(question))
    assert streamed == whole.content  # greedy: the same answer either way
    batch = chat_model.batch([question, "Name an animal."])
    assert batch[0].content == whole.content and batch[1].content
    assert whole.usage_metadata["output_tokens"] > 0


def test_langchain_bind_tools_with_a_forced_call(chat_model):
    model = chat_model.model_copy(update={"max_tokens": 40}).bind_tools([Weather], tool_choice="Weather")
    msg = model.invoke("What is the weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "Weather"
    Weather.model_validate(call["args"])


def test_langchain_with_structured_output(chat_model):
    for method in ("json_schema", "function_calling"):
        structured = chat_model.model_copy(update={"max_tokens": 40}).with_structured_output(
            Weather, method=method
        )
        out = structured.invoke("The weather in Oslo, in c.")
        assert isinstance(out, Weather), method


def test_litellm_completion_and_stream(server):
    litellm = pytest.importorskip("litellm")
    args = {
        "model": f"openai/{MODEL}",
        "api_base": server.url + "/v1",
        "api_key": "unused",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    whole = litellm.completion(**args)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(**args, stream=True))
    assert streamed == text


def test_litellm_tool_call(server):
    litellm = pytest.importorskip("litellm")
    tool = {"type": "function", "function": {"name": "Weather", "parameters": Weather.model_json_schema()}}
    out = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=server.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        max_tokens=40,
        temperature=0,
    )
    (call,) = out.choices[0].message.tool_calls
    Weather.model_validate(json.loads(call.function.arguments))
