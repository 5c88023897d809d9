"""Every example runs on the bundled model and prints what it promises."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import assert_no_leaked_pages

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_leaks(runtime):
    yield
    assert_no_leaked_pages(runtime)


def test_quickstart(runtime, capsys):
    state = load("quickstart").main(runtime)
    out = capsys.readouterr().out
    assert "Paris" in state["answer"] and state.plan_hash in out


def test_code_complete(runtime, capsys):
    state = load("code_complete").main(runtime)
    out = capsys.readouterr().out
    assert out.startswith("def fib(n):") and "```" not in state["code"]
    assert "finish:" in out


def test_can_error_analyze(runtime, capsys):
    example = load("can_error_analyze")
    states = example.main(runtime)
    lines = capsys.readouterr().out.splitlines()
    assert len(states) == len(lines) == len(example.LOG_LINES)
    assert all(" ms " in line for line in lines)
    # The fixed instruction prefix is computed once and then comes from the prefix cache.
    assert all(s.get_meta_info("analysis")["cached_tokens"] >= 64 for s in states[1:])


def test_few_shot_select(runtime, capsys):
    example = load("few_shot_select")
    states = example.main(runtime)
    assert [s["label"] for s in states] == ["negative", "positive", "positive"]
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_fork_branches(runtime, capsys):
    state = load("fork_branches").main(runtime)
    assert isinstance(state["detail"], list) and len(state["detail"]) == 2
    assert capsys.readouterr().out.count("tip ") == 2


def test_json_extract(runtime, capsys):
    person = load("json_extract").main(runtime)
    assert set(person) == {"name", "age", "city"} and isinstance(person["age"], int)
    assert json.loads(capsys.readouterr().out.replace("'", '"')) == person


def test_chat_multi_turn(runtime, capsys):
    state = load("chat_multi_turn").main(runtime)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert capsys.readouterr().out.count("assistant:") == 2
