"""Tracing into a `GraphPlan`: the nodes, the exact JSON round trip, a hash that is the same in every
process, the readable dump, and `TraceError` (file:line) for programs that are not static."""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sgjit as sgl
from sgjit.compiler.nodes import Arg, ConstText, Fork, Gen, Join, RoleBegin, Select, VarScopeBegin
from sgjit.compiler.plan import GraphPlan
from sgjit.errors import ProgramError, TraceError

REPO = Path(__file__).resolve().parents[2]


@sgl.function
def everything(s, topic, style):
    s += sgl.system("You write " + style + " text.")
    with s.user():
        s += "Tell me about " + topic + "."
    s += sgl.assistant(
        sgl.gen(
            "answer",
            max_tokens=16,
            stop=["\n", "END"],
            temperature=0,
            top_p=0.9,
            top_k=0,
            return_logprob=True,
        )
    )
    with s.var_scope("verdict"):
        s += "Verdict:" + sgl.select(
            "v", choices=[" good", " bad"], choices_method=sgl.greedy_token_selection
        )
    forks = s.fork(2)
    forks += lambda i: " Idea " + str(i) + ":" + sgl.gen("idea", max_tokens=4, regex="[a-z ]+")
    forks.join()
    s += sgl.gen_int("n", max_tokens=3) + sgl.gen("j", json_schema={"type": "object"}, max_tokens=8)


def test_trace_records_the_programs_nodes():
    plan = everything.trace(topic="owls", style="dry")
    assert plan.name == "everything" and plan.arg_names == ("topic", "style")
    assert plan.nodes[:4] == (RoleBegin("system"), ConstText("You write "), Arg("style"), ConstText(" text."))
    kinds = [n.kind for n in plan.nodes]
    assert kinds == [
        "role_begin", "text", "arg", "text", "role_end",
        "role_begin", "text", "arg", "text", "role_end",
        "role_begin", "gen", "role_end",
        "var_scope_begin", "text", "select", "var_scope_end",
        "fork", "join", "gen", "gen",
    ]  # fmt: skip
    gen = plan.nodes[11]
    assert gen == Gen.of(
        "answer", max_tokens=16, stop=("\n", "END"), temperature=0.0, top_p=0.9, top_k=-1, return_logprob=True
    )
    assert isinstance(gen.temperature, float)  # normalised: 0 and 0.0 are one program
    assert plan.nodes[15] == Select("v", (" good", " bad"), 0.0, "greedy_token_selection")
    assert plan.nodes[13] == VarScopeBegin("verdict")
    fork = plan.nodes[17]
    assert isinstance(fork, Fork) and len(fork.branches) == 2
    assert fork.branches[1][0] == ConstText(" Idea 1:")
    assert plan.nodes[18] == Join(17)
    assert plan.nodes[19].regex == r"[-+]?[0-9]{1,19}[ \n]*" and plan.nodes[19].stop == (" ", "\n")  # gen_int
    assert plan.nodes[20].json_schema == '{"type": "object"}'


def test_adjacent_text_merges_so_equal_programs_hash_equal():
    def one(s):
        s += "ab" + sgl.gen("x")

    def two(s):
        s += "a"
        s += "b"
        s += sgl.gen("x")

    a, b = sgl.function(one).trace(), sgl.function(two).trace()
    assert a.nodes == b.nodes and a.source_hash != b.source_hash
    assert a.plan_hash != b.plan_hash  # the function name is part of the program
    renamed = GraphPlan("one", b.arg_names, b.nodes, b.source_hash)
    assert renamed.plan_hash == a.plan_hash  # the source hash is not


def test_json_round_trip_is_exact():
    plan = everything.trace()
    text = plan.to_json()
    again = GraphPlan.from_json(text)
    assert again == plan and again.plan_hash == plan.plan_hash
    assert again.to_json() == text
    assert again.source_hash == plan.source_hash != ""
    assert again.dump() == plan.dump()


def test_hash_depends_on_the_program_not_on_example_values():
    assert everything.trace(topic="a", style="b").plan_hash == everything.trace().plan_hash

    def short(s):
        s += "x" + sgl.gen("y", max_tokens=4)

    def longer(s):
        s += "x" + sgl.gen("y", max_tokens=5)

    assert sgl.function(short).trace().plan_hash != sgl.function(longer).trace().plan_hash


def test_plan_hash_is_the_same_in_another_process(tmp_path):
    module = tmp_path / "hash_program.py"
    module.write_text(
        textwrap.dedent(
            """
            import sgjit

            @sgjit.function
            def program(s, question):
                s += sgjit.system("Be precise.")
                s += sgjit.user("Q: " + question)
                s += sgjit.assistant(sgjit.gen("a", max_tokens=8, stop=["\\n"], temperature=0.5))
                forks = s.fork(2)
                forks += sgjit.select("c", choices=["x", "y"])
                forks.join()
            """
        )
    )
    script = "import sys; sys.path.insert(0, sys.argv[1]); import hash_program; print(hash_program.program.trace().plan_hash)"
    hashes = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        hashes.append(proc.stdout.strip())
    sys.path.insert(0, str(tmp_path))
    try:
        import hash_program

        here = hash_program.program.trace().plan_hash
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hash_program", None)
    assert hashes[0] == hashes[1] == here and len(here) == 16


def test_dump_prints_one_line_a_node(runtime):
    plan = everything.trace()
    lines = plan.dump().splitlines()
    assert lines[0].startswith(f"plan everything(topic, style) hash={plan.plan_hash}")
    node_lines = [line for line in lines[1:] if not line.strip().startswith("branch")]
    assert len(node_lines) == len(plan.nodes) + sum(len(b) for b in plan.nodes[17].branches)
    gen_line = next(line for line in lines if " gen " in line and "answer" in line)
    assert "max_tokens=16" in gen_line and gen_line.endswith("<=16 tok")
    assert "~3 tok" in lines[2]  # 'You write ' estimated
    counted = plan.dump(encode=runtime.tokenizer.encode).splitlines()[2]
    assert counted.endswith(f"{len(runtime.tokenizer.encode('You write '))} tok")


def test_from_json_checks_what_it_reads():
    plan = everything.trace()
    with pytest.raises(ProgramError, match="plan hash mismatch"):
        GraphPlan.from_json(plan.to_json().replace('"max_tokens":16', '"max_tokens":17'))
    with pytest.raises(ProgramError, match="not a sgjit.plan/1 plan"):
        GraphPlan.from_json('{"format": "other"}')
    broken = '{"format":"sgjit.plan/1","name":"f","args":[],"nodes":[{"kind":"role_end","role":"user"}]}'
    with pytest.raises(ProgramError, match="does not match"):
        GraphPlan.from_json(broken)
    unknown_arg = '{"format":"sgjit.plan/1","name":"f","args":[],"nodes":[{"kind":"arg","name":"q"}]}'
    with pytest.raises(ProgramError, match="does not declare"):
        GraphPlan.from_json(unknown_arg)


# ----- programs that cannot be traced -----


def line_of(fn, marker: str = "# <- here") -> str:
    lines, start = inspect.getsourcelines(fn.func)
    return f"{__file__}:{start + next(i for i, line in enumerate(lines) if marker in line)}"


@sgl.function(jit=True)
def branches_on_generated(s):
    s += "Is it raining?" + sgl.gen("yn", max_tokens=2)
    if s["yn"] == " yes":  # <- here
        s += " Take an umbrella."


@sgl.function(jit=True)
def branches_on_argument(s, mood):
    if mood == "happy":  # <- here
        s += "Great!"


@sgl.function(jit=True)
def formats_argument(s, name):
    s += f"Hello {name}, welcome." + sgl.gen("x")  # <- here


@sgl.function(jit=True)
def calls_the_clock(s):
    s += "The time is " + str(time.time())  # <- here
    s += sgl.gen("x")


@sgl.function(jit=True)
def swallows_the_error(s):
    try:
        s += "Roll: " + str(random.random())  # <- here
    except Exception:
        s += "no dice"


@sgl.function(jit=True)
def asks_the_runtime(s):
    s += "Vocabulary: " + str(sgl.get_default_backend().runtime.model_config.vocab_size)  # <- here


@sgl.function(jit=True)
def uses_a_string_method(s, text):
    s += text.upper()  # <- here


@sgl.function(jit=True)
def argument_as_parameter(s, n):
    s += "x" + sgl.gen("y", max_tokens=n)  # <- here


@sgl.function(jit=True)
def returns_a_value(s):  # <- here
    s += "x"
    return 1


@pytest.mark.parametrize(
    "program, reason",
    [
        (branches_on_generated, "reads the generated variable 'yn'"),
        (branches_on_argument, "compares argument 'mood'"),
        (formats_argument, "formats argument 'name' in an f-string"),
        (calls_the_clock, "calls time.time()"),
        (swallows_the_error, "calls Random.random()"),
        (asks_the_runtime, "calls sgjit.lang.default_backend.get_default_backend()"),
        (uses_a_string_method, "calls .upper on argument 'text'"),
        (argument_as_parameter, "argument 'n' is used as gen('y') parameter max_tokens"),
        (returns_a_value, "returns a value"),
    ],
)
def test_untraceable_programs_raise_trace_error_at_their_line(program, reason, runtime):
    with pytest.raises(TraceError) as err:
        program.trace()
    message = str(err.value)
    assert message.startswith(line_of(program) + ": cannot trace " + program.name + "()"), message
    assert reason in message
    args = {name: "happy" for name in list(program.signature.parameters)[1:]}
    with pytest.raises(TraceError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        program.run(backend=runtime, **args)  # jit=True demands the plan


def test_without_jit_an_untraceable_program_runs_interpreted(runtime):
    def greet(s, mood):
        if mood == "happy":
            s += "Great! "
        s += "Say hi:" + sgl.gen("x", max_tokens=3)

    auto, interpreted = sgl.function(greet), sgl.function(greet, jit=False)
    a = auto.run(mood="happy", temperature=0, backend=runtime)
    b = interpreted.run(mood="happy", temperature=0, backend=runtime)
    assert a.plan_hash is None and a.text() == b.text() and a.text().startswith("Great! Say hi:")

    def answers(s):
        s += "x"
        return 42

    assert sgl.function(answers).run(backend=runtime).ret_value == 42


def test_non_text_arguments_run_interpreted_unless_jit_demands_the_plan(runtime):
    def shout(s, word):
        s += "Say " + word + "!"

    assert sgl.function(shout).run(word="hi", backend=runtime).plan_hash is not None
    with pytest.raises(TypeError):  # what Python itself says about "Say " + 3
        sgl.function(shout).run(word=3, backend=runtime)
    with pytest.raises(
        ProgramError, match="argument 'word' is a int, but the traced plan inserts it as text"
    ):
        sgl.function(shout, jit=True).run(word=3, backend=runtime)
