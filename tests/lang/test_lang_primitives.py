"""Each language primitive on the bundled model: gen and its typed forms, select and its methods,
roles rendered with the model's template, expressions, and what a state can read back."""

from __future__ import annotations

import json

import jsonschema
import pytest

import sgjit as sgl

from conftest import assert_no_leaked_pages


@pytest.fixture(autouse=True)
def default_backend(runtime):
    sgl.set_default_backend(runtime)


def test_gen_takes_run_defaults_unless_it_sets_its_own():
    @sgl.function
    def count(s):
        s += "Count: 1, 2, 3,"
        s += sgl.gen("a")
        s += sgl.gen("b", max_tokens=2)

    st = count.run(max_new_tokens=4, ignore_eos=True, temperature=0)
    assert st.get_meta_info("a")["completion_tokens"] == 4
    assert st.get_meta_info("b")["completion_tokens"] == 2
    assert st.text() == "Count: 1, 2, 3," + st["a"] + st["b"]


def test_gen_stops_at_a_stop_string():
    @sgl.function
    def numbers(s):
        s += "1, 2, 3, 4, 5,"
        s += sgl.gen("rest", max_tokens=30, stop=" 8")

    st = numbers.run(temperature=0)
    assert st.get_meta_info("rest")["finish_reason"] == {"type": "stop", "matched": " 8"}
    assert st["rest"].endswith("7,") and " 8" not in st.text()


def test_typed_gens_match_their_regex():
    @sgl.function
    def facts(s):
        s += "Q: How many legs does a spider have?\nA (a number): "
        s += sgl.gen_int("legs", max_tokens=4)
        s += "\nQ: Is the sky green?\nA (True or False): "
        s += sgl.gen("green", dtype=bool, max_tokens=3)
        s += "\nQ: Name a colour, quoted.\nA: "
        s += sgl.gen_string("colour", max_tokens=8)
        s += "\nQ: Three capital letters.\nA: "
        s += sgl.gen("caps", regex="[A-Z]{3}", max_tokens=4)

    st = facts.run(temperature=0)
    int(st["legs"])
    assert st["green"] in ("True", "False")
    assert st["colour"].startswith('"')
    assert len(st["caps"]) == 3 and st["caps"].isupper()


def test_json_schema_gen_yields_json_that_fits():
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "country": {"type": "string", "maxLength": 12},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }

    @sgl.function
    def city(s):
        s += sgl.user("Describe Paris as JSON: its name and its country.")
        s += sgl.assistant(sgl.gen("info", json_schema=schema, max_tokens=40))

    st = city.run(temperature=0)
    jsonschema.validate(json.loads(st["info"]), schema)


def test_gen_logprobs_reach_the_meta_info():
    @sgl.function
    def f(s):
        s += "The capital of France is"
        s += sgl.gen("x", max_tokens=3, ignore_eos=True, return_logprob=True, top_logprobs_num=2)

    meta = f.run(temperature=0).get_meta_info("x")
    assert len(meta["output_token_logprobs"]) == 3
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


@pytest.mark.parametrize(
    "method",
    [sgl.token_length_normalized, sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized],
)
def test_select_methods_pick_a_choice_and_report_scores(method):
    @sgl.function
    def capital(s):
        s += "The capital of France is"
        s += sgl.select(
            "city", choices=[" Paris", " a small village in Peru", " Rome"], choices_method=method
        )

    st = capital.run()
    meta = st.get_meta_info("city")
    assert st["city"] == meta["choices"][meta["selected"]]
    assert meta["choices_method"] == method.name and len(meta["scores"]) == 3
    assert st["city"] == " Paris"
    assert ("unconditional_token_logprobs" in meta) == method.needs_unconditional


def test_gen_with_choices_is_a_select():
    @sgl.function
    def f(s):
        s += "The capital of France is"
        s += sgl.gen("city", choices=[" Rome", " Paris"])

    plan = f.trace()
    assert [n.kind for n in plan.nodes] == ["text", "select"]
    assert f.run()["city"] == " Paris"


def test_select_scores_are_the_engines_logprobs_of_each_choice(runtime):
    prefix = "The capital of France is"
    choices = [" Paris", " Lyon"]

    @sgl.function
    def f(s):
        s += prefix
        s += sgl.select("city", choices=choices)

    meta = f.run().get_meta_info("city")
    tok = runtime.tokenizer
    for choice, got in zip(choices, meta["token_logprobs"]):
        ids = tok.encode(prefix + choice)
        assert ids[: len(tok.encode(prefix))] == tok.encode(prefix)  # the choice starts a new token
        start = len(tok.encode(prefix))
        out = runtime.generate(
            input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=start
        )
        want = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)


def test_select_scores_every_choice_in_one_forward_pass(runtime):
    @sgl.function
    def f(s):
        s += "My favourite colour is"
        s += sgl.select("c", choices=[" red", " green", " blue", " yellow", " purple"])

    before = runtime.stats()
    f.run()
    after = runtime.stats()
    assert after["requests_total"] - before["requests_total"] == 1 + 5  # prefix, then the choices
    assert after["steps"] - before["steps"] == 2  # one step computes the prefix, one scores all five
    assert_no_leaked_pages(runtime)


def test_select_with_temperature_samples_among_choices():
    logprobs = [[-1.0, -2.0], [-1.5]]
    method = sgl.token_length_normalized
    assert {method.decide(logprobs)[0] for _ in range(50)} == {0}
    assert {method.decide(logprobs, temperature=100.0)[0] for _ in range(200)} == {0, 1}

    @sgl.function
    def f(s):
        s += "Pick one:"
        s += sgl.select("x", choices=[" left", " right"], temperature=100.0)

    assert f.run()["x"] in (" left", " right")


def test_roles_render_with_the_models_chat_template(runtime):
    @sgl.function
    def chat(s):
        s += sgl.user("Hi there")
        s += sgl.assistant("Hello!")

    st = chat.run()
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
    assert st.text() == runtime.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert "You are a helpful AI assistant named SmolLM" in st.text()  # the template's default system prompt
    assert st.messages() == messages

    @sgl.function
    def with_system(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Hi there")

    text = with_system.run().text()
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in text


def test_the_three_role_forms_render_the_same():
    @sgl.function
    def whole(s):
        s += sgl.user("Question?")
        s += sgl.assistant("Answer.")

    @sgl.function
    def begin_end(s):
        s += sgl.user_begin() + "Question?" + sgl.user_end()
        s += sgl.assistant_begin()
        s += "Answer."
        s += sgl.assistant_end()

    @sgl.function
    def blocks(s):
        with s.user():
            s += "Question?"
        s.assistant("Answer.")

    texts = {f.run().text() for f in (whole, begin_end, blocks)}
    assert len(texts) == 1


def test_a_gen_inside_the_assistant_role_answers_like_runtime_chat(runtime):
    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=10))

    q = "What is the capital of France?"
    st = qa.run(question=q, temperature=0)
    ref = runtime.chat([{"role": "user", "content": q}], {"temperature": 0, "max_new_tokens": 10})
    assert st["answer"] == ref["text"]
    assert st.messages()[-1] == {"role": "assistant", "content": ref["text"]}


def test_expressions_concatenate_text_arguments_and_gens():
    @sgl.function
    def f(s, name):
        s += "Hello, " + name + "! Your lucky number is" + sgl.gen("n", max_tokens=2, ignore_eos=True) + "."
        s += ["\nBye", ", ", name, sgl.gen("tail", max_tokens=1, ignore_eos=True)]

    st = f.run(name="Ada", temperature=0)
    assert st.text() == f"Hello, Ada! Your lucky number is{st['n']}.\nBye, Ada{st['tail']}"


def test_var_scope_captures_what_was_appended_inside_it():
    @sgl.function
    def f(s):
        s += "Start. "
        with s.var_scope("middle"):
            s += "Colours: red," + sgl.gen("more", max_tokens=3, ignore_eos=True)
        s += " End."

    st = f.run(temperature=0)
    assert st["middle"] == "Colours: red," + st["more"]
    assert st.text() == "Start. " + st["middle"] + " End."


def test_copy_continues_separately_from_its_parent():
    seen = {}

    @sgl.function(jit=False)
    def f(s):
        s += "Shared start."
        c = s.copy()
        c += " Only in the copy." + sgl.gen("x", max_tokens=2, ignore_eos=True)
        s += " Only in the parent."
        seen["copy"] = c.text()

    st = f.run(temperature=0)
    assert st.text() == "Shared start. Only in the parent."
    assert seen["copy"].startswith("Shared start. Only in the copy.")


def test_programs_compose_by_calling_each_other():
    @sgl.function
    def greet(s, name):
        s += "Hello, " + name + ". "

    @sgl.function
    def both(s, a, b):
        greet(s, a)
        greet(s, b)

    assert both.run(a="Ann", b="Bob").text() == "Hello, Ann. Hello, Bob. "
    assert [n.kind for n in both.trace().nodes] == ["text", "arg", "text", "arg", "text"]


def test_join_modes():
    @sgl.function
    def gather(s):
        s += "Base."
        forks = s.fork(2)
        forks += lambda i: " branch " + str(i) + "." + sgl.gen("x", max_tokens=2, ignore_eos=True)
        forks.join()

    st = gather.run(temperature=0)
    assert st.text() == "Base." and len(st["x"]) == 2 and len(st.get_meta_info("x")) == 2

    @sgl.function
    def concatenate(s):
        s += "Base."
        forks = s.fork(2)
        forks += [" one.", " two."]
        forks.join("concate_and_append")
        s += " End."

    assert concatenate.run().text() == "Base. one. two. End."
