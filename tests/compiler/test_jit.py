"""The JIT on CPU: compile once then hit, the log line, eviction unpins, clear and reload invalidate,
a fresh process reuses the disk cache, JIT on and off agree, oversized plans are rejected."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap

import pytest

import sgjit
from sgjit.compiler.prefix import stable_prefix
from sgjit.errors import CapacityError
from sgjit.kernels.cpp import build
from sgjit.lang.runtime_backend import RuntimeBackend

from conftest import assert_no_leaked_pages


def stats(rt: sgjit.Runtime) -> dict:
    """The engine's counters and the JIT's (which belongs to the runtime's backend)."""
    return {**rt.stats(), **RuntimeBackend.of(rt).jit_counters()}


def jit_of(rt: sgjit.Runtime):
    return RuntimeBackend.of(rt).jit


@pytest.fixture(scope="module")
def jit_rt(tmp_path_factory):
    old = os.environ.get("SGJIT_CACHE_DIR")
    os.environ["SGJIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("sgjit-cache"))
    rt = sgjit.Runtime(device="cpu", enable_jit=True, max_total_tokens=8192, jit_cache_limit=3, seed=0)
    yield rt
    rt.shutdown()
    if old is None:
        os.environ.pop("SGJIT_CACHE_DIR", None)
    else:
        os.environ["SGJIT_CACHE_DIR"] = old


FEW_SHOT = "".join(
    f"Review: {t}\nSentiment: {lab}\n\n"
    for t, lab in [
        ("Loved every minute.", "positive"),
        ("A waste of money.", "negative"),
        ("It was fine.", "neutral"),
    ]
    * 4
)


@sgjit.function
def classify(s, review):
    s += FEW_SHOT + "Review: " + review + "\nSentiment: "
    s += sgjit.select("label", choices=["positive", "negative", "neutral"])


@sgjit.function
def chat_twice(s, question):
    s += sgjit.system("You answer in one short sentence.")
    s += sgjit.user(question)
    s += sgjit.assistant(sgjit.gen("a1", max_tokens=12, temperature=0))
    s += sgjit.user("Say it again, shorter.")
    s += sgjit.assistant(sgjit.gen("a2", max_tokens=8, temperature=0))


@sgjit.function
def branches(s, topic):
    s += "Three facts about " + topic + ":\n"
    forks = s.fork(2)
    forks += [sgjit.gen("fact", max_tokens=8, temperature=0, stop="\n")] * 2
    forks.join()


def test_compile_once_then_hit_with_one_log_line(jit_rt, caplog):
    sgjit.clear_jit_cache(jit_rt)
    before = stats(jit_rt)
    with caplog.at_level(logging.INFO, logger="sgjit.compiler.jit"):
        a = classify.run(review="Great fun!", backend=jit_rt)
        b = classify.run(review="Dull and long.", backend=jit_rt)
    lines = [r.getMessage() for r in caplog.records if "JIT compiled GraphPlan" in r.getMessage()]
    assert len(lines) == 1
    plan = classify.plan()
    assert lines[0].startswith("JIT compiled GraphPlan classify_")
    assert (
        "arch cpu-" in lines[0] and f"hash {plan.plan_hash[:12]} in " in lines[0] and lines[0].endswith(" ms")
    )
    after = stats(jit_rt)
    assert after["jit_compiles"] == before["jit_compiles"] + 1
    assert after["jit_cache_hits"] >= before["jit_cache_hits"] + 1
    assert after["jit_compile_ms_total"] > before["jit_compile_ms_total"]
    assert a["label"] in ("positive", "negative", "neutral") and b["label"] in (
        "positive",
        "negative",
        "neutral",
    )


def test_runs_prefill_only_their_arguments(jit_rt):
    sgjit.clear_jit_cache(jit_rt)
    classify.run(review="x", backend=jit_rt)  # compile: the prefix is prefilled and pinned now
    jit_rt.flush_cache()  # pinned pages survive a flush
    hits = stats(jit_rt)["prefix_cache_hit_tokens"]
    classify.run(review="An honest, moving film.", backend=jit_rt)
    prefix_len = jit_of(jit_rt).compile(classify.plan()).prefix.ids
    assert stats(jit_rt)["prefix_cache_hit_tokens"] - hits >= (len(prefix_len) // 16) * 16 > 0


def test_jit_on_and_off_agree(jit_rt, runtime):
    for fn, kwargs in [
        (classify, {"review": "Not bad at all."}),
        (chat_twice, {"question": "What is the sun?"}),
        (branches, {"topic": "owls"}),
    ]:
        on = fn.run(backend=jit_rt, **kwargs)
        off = fn.run(backend=runtime, **kwargs)
        assert on.text() == off.text(), fn.name
    assert_no_leaked_pages(runtime)


def test_prefix_reuse_tokenizes_exactly(jit_rt):
    tok = jit_rt.tokenizer
    rng = random.Random(0)
    alphabet = "abc XYZ 0123\n\t.,!?é的😀<|im_end|>"
    for text in [FEW_SHOT + "Review: ", "<|im_start|>user\nHi", "def f(x):\n    return", "word"]:
        for add_special in (True, False):
            p = stable_prefix(tok, text, add_special)
            for _ in range(40):
                tail = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
                ids = p.encode(tok, text + tail)
                if ids is not None:
                    assert ids == tok.encode(text + tail, add_special_tokens=add_special), (text, tail)


def test_eviction_at_the_limit_unpins(jit_rt):
    sgjit.clear_jit_cache(jit_rt)
    plans = []

    def make(text: str):
        @sgjit.function
        def prog(s, x):
            s += text + x
            s += sgjit.gen("y", max_tokens=2, temperature=0)

        return prog

    for i in range(4):  # limit is 3
        prog = make(f"Program {i}. " * 40)
        prog.run(x="go", backend=jit_rt)
        plans.append(prog.plan())
    s = stats(jit_rt)
    assert s["jit_plans_cached"] == 3 and s["jit_evictions"] >= 1
    assert (plans[0].plan_hash, jit_of(jit_rt).arch_hash) not in jit_of(jit_rt).cache
    sgjit.clear_jit_cache(jit_rt)
    assert stats(jit_rt)["jit_plans_cached"] == 0
    assert_no_leaked_pages(jit_rt)  # nothing stays pinned


def test_clear_jit_cache_forces_a_recompile(jit_rt):
    sgjit.set_default_backend(jit_rt)
    classify.run(review="ok")
    n = stats(jit_rt)["jit_compiles"]
    assert sgjit.clear_jit_cache() >= 1
    classify.run(review="ok")
    assert stats(jit_rt)["jit_compiles"] == n + 1


def test_reload_function_invalidates_the_old_plan(jit_rt, tmp_path, monkeypatch):
    mod = tmp_path / "jit_prog_mod.py"
    mod.write_text(
        textwrap.dedent("""
        import sgjit

        @sgjit.function
        def greet(s, name):
            s += "Hello, " + name + "! Today we"
            s += sgjit.gen("rest", max_tokens=3, temperature=0)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import jit_prog_mod

    jit_prog_mod.greet.run(name="Ada", backend=jit_rt)
    old = jit_prog_mod.greet.plan().plan_hash
    assert (old, jit_of(jit_rt).arch_hash) in jit_of(jit_rt).cache
    mod.write_text(mod.read_text().replace("Today we", "Tomorrow we"))
    new_fn = sgjit.reload_function(jit_prog_mod.greet, backend=jit_rt)
    assert new_fn.plan().plan_hash != old
    assert (old, jit_of(jit_rt).arch_hash) not in jit_of(jit_rt).cache
    assert "Tomorrow" in new_fn.run(name="Ada", backend=jit_rt).text()


def test_oversized_plan_is_rejected_at_compile_time(jit_rt):
    @sgjit.function
    def huge(s, x):
        s += "Write forever: " + x
        s += sgjit.gen("essay", max_tokens=1_000_000)

    with pytest.raises(CapacityError, match="needs up to"):
        huge.run(x="go", backend=jit_rt)
    assert stats(jit_rt)["running"] == 0
    sgjit.clear_jit_cache(jit_rt)  # the other plans' pinned prefixes are the only pages still held
    assert_no_leaked_pages(jit_rt)


def test_a_fresh_process_reuses_the_disk_cache(tmp_path):
    script = textwrap.dedent("""
        import json, sgjit
        from sgjit.lang.runtime_backend import RuntimeBackend
        rt = sgjit.Runtime(device="cpu", enable_jit=True, max_total_tokens=2048)

        @sgjit.function
        def hello(s, name):
            s += "You are a kind assistant. Greet people warmly.\\n" * 8 + "Name: " + name + "\\nGreeting:"
            s += sgjit.gen("g", max_tokens=2, temperature=0)

        hello.run(name="Ada", backend=rt)
        print(json.dumps(RuntimeBackend.of(rt).jit_counters()))
        rt.shutdown()
    """)
    env = {**os.environ, "SGJIT_CACHE_DIR": str(tmp_path / "cache")}
    build.seed_cache(tmp_path / "cache")  # the C++ CPU kernels: not what this test is about
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(2)
    ]
    assert runs[0]["jit_disk_hits"] == 0 and runs[1]["jit_disk_hits"] == 1
    assert runs[1]["jit_compiles"] == 1
