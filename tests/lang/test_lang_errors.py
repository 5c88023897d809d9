"""Ill-formed programs fail with `sgjit.errors` exceptions whose messages say what to do, before the
engine does any work for them."""

from __future__ import annotations

import pytest

import sgjit as sgl
from sgjit.errors import ProgramError
from sgjit.lang import default_backend

from conftest import assert_no_leaked_pages


@pytest.fixture(autouse=True)
def backend(runtime):
    sgl.set_default_backend(runtime)


def run_program(body, **kwargs):
    return sgl.function(body).run(**kwargs)


def test_gen_outside_a_function():
    with pytest.raises(ProgramError, match=r"outside a prompt program.*@sgjit.function"):
        sgl.gen("x")
    with pytest.raises(ProgramError, match="outside a prompt program"):
        sgl.select("x", choices=["a", "b"])


def test_expressions_are_not_text():
    with pytest.raises(ProgramError, match="program step, not text"):
        str(sgl.user("hello"))
    with pytest.raises(ProgramError, match="program step, not text"):
        f"{sgl.assistant('x')}"


@pytest.mark.parametrize("choices", [[], None])
def test_select_without_choices(choices):
    def body(s):
        s += "Pick:" + sgl.select("x", choices=choices)

    with pytest.raises(ProgramError, match=r"select\('x'\) has no choices; give a non-empty list"):
        run_program(body)


def test_nested_roles():
    def inline(s):
        s += sgl.user("question " + sgl.assistant("answer"))

    def blocks(s):
        with s.user():
            s += "question"
            with s.assistant():
                s += "answer"

    for body in (inline, blocks):
        with pytest.raises(
            ProgramError, match=r"assistant\(\) opened inside an open user\(\) role; roles cannot nest"
        ):
            run_program(body)


def test_role_end_without_its_begin():
    def body(s):
        s += sgl.user_begin() + "hi" + sgl.assistant_end()

    with pytest.raises(ProgramError, match="assistant_end.. does not match: the open role is user"):
        run_program(body)


def test_unknown_keyword_arguments():
    def gen_typo(s):
        s += sgl.gen("x", max_token=5)

    with pytest.raises(
        ProgramError,
        match=r"gen\(\) got unknown keyword argument\(s\) \['max_token'\]; it takes name, max_tokens",
    ):
        run_program(gen_typo)

    def select_typo(s):
        s += sgl.select("x", choices=["a"], method="greedy")

    with pytest.raises(ProgramError, match=r"select\(\) got unknown keyword argument\(s\) \['method'\]"):
        run_program(select_typo)

    with pytest.raises(ProgramError, match=r"unknown keyword argument\(s\) \['jitt'\]; it takes jit"):
        sgl.function(jitt=True)

    def takes_q(s, q):
        s += q

    with pytest.raises(
        ProgramError, match=r"takes_q\(\): got an unexpected keyword argument 'question'.*\['q'\]"
    ):
        run_program(takes_q, q="a", question="hi")
    with pytest.raises(ProgramError, match=r"run_batch\(\) got unknown keyword\(s\) \['q'\]"):
        sgl.function(takes_q).run_batch([{"q": "a"}], q="b")
    with pytest.raises(ProgramError, match="temperature"):
        run_program(takes_q, q="a", temperature=-1.0)


def test_a_name_used_twice():
    def twice(s):
        s += "A" + sgl.gen("x", max_tokens=1)
        s += "B" + sgl.gen("x", max_tokens=1)

    def in_join(s):
        s += "A" + sgl.gen("x", max_tokens=1)
        forks = s.fork(2)
        forks += sgl.gen("x", max_tokens=1)

    for body in (twice, in_join):
        with pytest.raises(ProgramError, match="variable name 'x' is used twice in this program"):
            run_program(body)


def test_invalid_gen_parameters_name_the_parameter():
    def body(s):
        s += sgl.gen("x", max_tokens=-3)

    with pytest.raises(ProgramError, match=r"gen\('x'\): invalid max_tokens"):
        run_program(body)

    def both(s):
        s += sgl.gen("x", dtype=int, regex="[0-9]")

    with pytest.raises(ProgramError, match="give dtype or regex, not both"):
        run_program(both)


def test_other_misuse():
    def adds_a_number(s):
        s += 42

    with pytest.raises(ProgramError, match="cannot add a int to a program"):
        run_program(adds_a_number)

    def zero_forks(s):
        s += "x"
        s.fork(0)

    with pytest.raises(ProgramError, match="at least one branch"):
        run_program(zero_forks)

    def no_state():
        pass

    with pytest.raises(ProgramError, match="first parameter"):
        sgl.function(no_state)

    def reads_missing(s):
        s += "x"
        s["nothing"]

    with pytest.raises(ProgramError, match="no variable 'nothing'"):
        sgl.function(reads_missing, jit=False).run()


def test_no_backend(monkeypatch):
    monkeypatch.setattr(default_backend, "_default", None)

    def body(s):
        s += "x"

    with pytest.raises(
        ProgramError, match=r"no backend to run on: call sgjit.set_default_backend\(sgjit.Runtime\(\)\)"
    ):
        run_program(body)
    with pytest.raises(ProgramError, match="is not an sgjit backend"):
        sgl.set_default_backend("http://localhost:30000")


def test_failed_programs_leave_no_pages(runtime):
    assert_no_leaked_pages(runtime)
