"""A program feeds the model exactly the tokens of its concatenated text: each gen's greedy output
equals `Runtime.generate` on the text before it, and the interpreted and the traced (plan) runs of
one program give the same result."""

from __future__ import annotations

import pytest

import sgjit as sgl

from conftest import assert_no_leaked_pages

GREEDY = {"temperature": 0.0}


@pytest.fixture(autouse=True)
def default_backend(runtime):
    sgl.set_default_backend(runtime)


def reference(runtime, text: str, chat: bool, **params):
    """What `Runtime.generate` makes of `text`, computed from scratch."""
    runtime.flush_cache()
    ids = runtime.tokenizer.encode(text, add_special_tokens=not chat)
    return runtime.generate(input_ids=ids, sampling_params={**GREEDY, **params}), len(ids)


def check_gen(runtime, state, name: str, text_before: str, chat: bool = False, **params) -> str:
    out, n_ids = reference(runtime, text_before, chat, **params)
    assert state[name] == out["text"], name
    assert state.get_meta_info(name)["prompt_tokens"] == n_ids, name  # the very same tokens
    return text_before + out["text"]


def test_plain_text_program_gen_by_gen(runtime):
    @sgl.function
    def facts(s, country):
        s += "The capital of " + country + " is"
        s += sgl.gen("capital", max_tokens=6)
        s += ". Its most famous building is"
        s += sgl.gen("building", max_tokens=6)

    st = facts.run(country="France", temperature=0)
    text = check_gen(runtime, st, "capital", "The capital of France is", max_new_tokens=6)
    check_gen(runtime, st, "building", text + ". Its most famous building is", max_new_tokens=6)
    assert_no_leaked_pages(runtime)


def test_boundaries_inside_words_are_tokenized_as_one_text(runtime):
    # The argument ends mid-word and the constant continues it: the tokens must be those of the
    # joined text ("wonderful"), not "wonder" + "ful" tokenized apart.
    @sgl.function
    def joined(s, stem):
        s += "It was a " + stem
        s += "ful day. We went to the"
        s += sgl.gen("place", max_tokens=5)
        s += "ly and then"
        s += sgl.gen("after", max_tokens=5)

    st = joined.run(stem="wonder", temperature=0)
    tok = runtime.tokenizer
    assert tok.encode("It was a wonder") + tok.encode("ful day.") != tok.encode("It was a wonderful day.")
    text = check_gen(runtime, st, "place", "It was a wonderful day. We went to the", max_new_tokens=5)
    check_gen(runtime, st, "after", text + "ly and then", max_new_tokens=5)


def test_chat_program_gen_by_gen(runtime):
    @sgl.function
    def two_turns(s, q1, q2):
        s += sgl.system("Answer briefly.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=8))
        s += sgl.user(q2)
        s += sgl.assistant("Sure: " + sgl.gen("a2", max_tokens=8))

    q1, q2 = "What is the capital of France?", "And of Italy?"
    st = two_turns.run(q1=q1, q2=q2, temperature=0)
    tpl = runtime.tokenizer.apply_chat_template
    history = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q1}]
    check_gen(runtime, st, "a1", tpl(history, add_generation_prompt=True), chat=True, max_new_tokens=8)
    history += [{"role": "assistant", "content": st["a1"]}, {"role": "user", "content": q2}]
    before_a2 = tpl(history, add_generation_prompt=True) + "Sure: "
    check_gen(runtime, st, "a2", before_a2, chat=True, max_new_tokens=8)
    assert st.text() == tpl([*history, {"role": "assistant", "content": "Sure: " + st["a2"]}], False)


def test_gen_after_select_sees_the_chosen_text(runtime):
    @sgl.function
    def pick(s):
        s += "Q: Is the sea salty? A:"
        s += sgl.select("yn", choices=[" Yes", " No"])
        s += ", because"
        s += sgl.gen("why", max_tokens=6)

    st = pick.run(temperature=0)
    check_gen(runtime, st, "why", "Q: Is the sea salty? A:" + st["yn"] + ", because", max_new_tokens=6)


def test_fork_branches_gen_like_their_own_text(runtime):
    @sgl.function
    def branches(s):
        s += "Three animals:"
        forks = s.fork(2)
        forks += [" cat,", " dog,"]
        forks += sgl.gen("next", max_tokens=4)
        forks.join()

    st = branches.run(temperature=0)
    for prefix, got in zip([" cat,", " dog,"], st["next"]):
        assert got == reference(runtime, "Three animals:" + prefix, False, max_new_tokens=4)[0]["text"]
    assert st.text() == "Three animals:"


calls: list[str] = []


def story(s, hero, place):
    calls.append("ran")
    s += sgl.system("You tell very short stories.")
    s += sgl.user("A story about " + hero + " in " + place + ".")
    s += sgl.assistant(sgl.gen("story", max_tokens=12))
    s += sgl.user("Give it a title.")
    s += sgl.assistant(sgl.gen("title", max_tokens=6))
    forks = s.fork(2)
    forks += lambda i: sgl.user("Moral " + str(i + 1) + "?") + sgl.assistant(sgl.gen("moral", max_tokens=5))
    forks.join()
    s += "Rating:" + sgl.select("rating", choices=[" good", " bad"])


def test_interpreted_and_traced_runs_give_identical_output():
    interpreted = sgl.function(story, jit=False)
    traced = sgl.function(story, jit=True)
    calls.clear()
    a = interpreted.run(hero="a fox", place="Paris", temperature=0)
    assert calls == ["ran"] and a.plan_hash is None  # the Python function ran

    b = traced.run(hero="a fox", place="Paris", temperature=0)
    c = traced.run(hero="a fox", place="Paris", temperature=0)
    assert calls == ["ran", "ran"]  # once to trace; the runs executed the plan, not the function
    assert b.plan_hash == c.plan_hash == traced.trace().plan_hash

    assert a.text() == b.text() == c.text()
    for name in ("story", "title", "moral", "rating"):
        assert a[name] == b[name]
    assert a.messages() == b.messages()


def test_default_mode_runs_the_plan_when_it_can_and_interprets_otherwise():
    @sgl.function
    def static(s, x):
        s += "Say " + x + ":" + sgl.gen("y", max_tokens=2)

    @sgl.function
    def dynamic(s, x):
        s += "Say " + x + ":" + sgl.gen("y", max_tokens=2)
        if s["y"].strip():  # control flow on a generated value: not traceable
            s += " ok"

    assert static.run(x="hi", temperature=0).plan_hash is not None
    st = dynamic.run(x="hi", temperature=0)
    assert st.plan_hash is None and st["y"] == static.run(x="hi", temperature=0)["y"]
