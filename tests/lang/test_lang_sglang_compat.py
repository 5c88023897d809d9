"""SGLang frontend programs, written as SGLang's documentation writes them, run unchanged after
`import sgjit as sgl` (only token budgets are shrunk for the CPU)."""

from __future__ import annotations

import pytest

import sgjit as sgl

from conftest import assert_no_leaked_pages


@pytest.fixture(autouse=True)
def default_backend(runtime):
    sgl.set_default_backend(runtime)
    yield
    assert_no_leaked_pages(runtime)


@sgl.function
def multi_turn_question(s, question_1, question_2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=12))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=12))


def test_multi_turn_question():
    state = multi_turn_question.run(
        question_1="What is the capital of the United States?",
        question_2="List two local attractions.",
        temperature=0,
    )
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["answer_1"] and state["answer_1"].startswith("The capital")
    assert state.plan_hash is not None  # static: it ran as a traced plan


def test_multi_turn_question_streaming():
    state = multi_turn_question.run(
        question_1="What is the capital of the United States?",
        question_2="List two local attractions.",
        temperature=0,
        stream=True,
    )
    answer_2 = "".join(out for out in state.text_iter("answer_2"))
    assert answer_2 == state["answer_2"] and answer_2


@sgl.function
def tool_use(s, question):
    s += "To answer this question: " + question + ". "
    s += "I need to use a " + sgl.gen("tool", choices=["calculator", "search engine"]) + ". "
    if s["tool"] == "calculator":
        s += "The math expression is" + sgl.gen("expression")
    elif s["tool"] == "search engine":
        s += "The key word to search is" + sgl.gen("word")


def test_tool_use_branches_on_a_select():
    state = tool_use.run(question="What is 12 times 7?", max_new_tokens=6, temperature=0)
    assert state["tool"] in ("calculator", "search engine")
    assert ("expression" in state) == (state["tool"] == "calculator")
    assert state.plan_hash is None  # control flow on a generated value: interpreted


@sgl.function
def tip_suggestion(s):
    s += "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"

    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into a paragraph:\n"
        f += sgl.gen("detailed_tip", max_tokens=10, stop="\n\n")

    s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
    s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary", max_tokens=8)


def test_tip_suggestion_reads_its_forks():
    state = tip_suggestion.run(temperature=0)
    text = state.text()
    assert text.startswith("Here are two tips")
    assert "In summary" + state["summary"] in text and "Tip 2:" in text


@sgl.function
def regular_expression_gen(s):
    s += "Q: What is the IP address of the Google DNS servers?\n"
    s += "A: " + sgl.gen(
        "answer",
        temperature=0,
        regex=r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    )


def test_regular_expression_gen():
    import re

    answer = regular_expression_gen.run(max_new_tokens=16)["answer"]
    assert re.fullmatch(r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)", answer)


@sgl.function
def text_qa(s, question):
    s += "Q: " + question + "\n"
    s += "A:" + sgl.gen("answer", stop="\n")


def test_text_qa_run_batch():
    questions = [
        {"question": "What is the capital of the United Kingdom?"},
        {"question": "What is the capital of France?"},
        {"question": "What is the capital of Japan?"},
    ]
    states = text_qa.run_batch(questions, max_new_tokens=8, temperature=0, progress_bar=True)
    assert "London" in states[0]["answer"] and "Paris" in states[1]["answer"]
    assert states[2]["answer"] == text_qa.run(**questions[2], max_new_tokens=8, temperature=0)["answer"]
