"""Running programs: batches through the engine's batching, streaming, fork page sharing, errors from
a step, and no KV page outliving its program."""

from __future__ import annotations

import pytest

import sgjit as sgl
from sgjit.errors import GrammarError

from conftest import assert_no_leaked_pages


@pytest.fixture(autouse=True)
def default_backend(runtime):
    sgl.set_default_backend(runtime)


@sgl.function
def echo(s, word):
    s += "Repeat the word " + word + ": " + word + ", " + word + ","
    s += sgl.gen("more", max_tokens=3, ignore_eos=True)


def test_run_batch_returns_states_in_order_and_batches_in_the_engine(runtime, capsys):
    words = [f"w{i}x" for i in range(16)]
    before = runtime.stats()["steps"]
    states = echo.run_batch([{"word": w} for w in words], temperature=0, progress_bar=True)
    steps = runtime.stats()["steps"] - before
    assert len(states) == 16
    for word, state in zip(words, states):
        assert state.text().startswith(f"Repeat the word {word}: ")
        assert state.get_meta_info("more")["completion_tokens"] == 3
    assert steps <= 24  # one after another would take 16 x 3 steps
    assert "16/16" in capsys.readouterr().err
    single = echo.run(word=words[5], temperature=0)
    assert single["more"] == states[5]["more"]
    assert_no_leaked_pages(runtime)


def test_run_batch_with_a_thread_limit():
    states = echo.run_batch([{"word": "a"}, {"word": "b"}, {"word": "c"}], num_threads=2, temperature=0)
    assert [s.text().split()[3] for s in states] == ["a:", "b:", "c:"]


@sgl.function
def two_gens(s, topic):
    s += sgl.user("Write one sentence about " + topic + ".")
    s += sgl.assistant(sgl.gen("first", max_tokens=10))
    s += sgl.user("Another one.")
    s += sgl.assistant(sgl.gen("second", max_tokens=10))


def test_streaming_yields_the_same_text_as_a_plain_run(runtime):
    plain = two_gens.run(topic="rain", temperature=0)
    streamed = two_gens.run(topic="rain", temperature=0, stream=True)
    chunks = list(streamed.text_iter())
    assert "".join(chunks) == plain.text()
    assert len(chunks) > 10  # it really came piece by piece
    assert "".join(streamed.text_iter("second")) == plain["second"]
    assert streamed["first"] == plain["first"] and streamed.text() == plain.text()
    assert list(plain.text_iter()) == [plain.text()]  # without stream=True: the whole text at once
    assert_no_leaked_pages(runtime)


def test_streaming_state_read_outside_waits_for_the_program():
    st = two_gens.run(topic="snow", temperature=0, stream=True)
    assert st["second"] == two_gens.run(topic="snow", temperature=0)["second"]


def test_fork_shares_the_prefix_pages(runtime):
    long_prefix = "Notes: " + " ".join(f"item{i}" for i in range(200)) + "."
    held: dict[str, int] = {}

    def pages_held() -> int:
        runtime.flush_cache()  # what is left is held by the program's sequences
        s = runtime.stats()
        return s["kv_pages_total"] - s["kv_pages_free"]

    @sgl.function(jit=False)
    def branches(s):
        s += long_prefix
        s += sgl.gen("a", max_tokens=1)
        s.sync()
        held["prefix"] = pages_held()
        forks = s.fork(4)
        forks += lambda i: f" Branch {i}:" + sgl.gen("b", max_tokens=12, ignore_eos=True)
        for f in forks:
            f.sync()
        held["branches"] = pages_held()
        forks.join()

    st = branches.run(temperature=0)
    assert len(st["b"]) == 4
    prefix_pages = len(runtime.tokenizer.encode(long_prefix)) // 16
    assert held["prefix"] >= prefix_pages > 20
    # Each branch adds its own few pages; copying the prefix would add 4 x prefix_pages.
    assert held["branches"] - held["prefix"] <= 4 * 3
    assert_no_leaked_pages(runtime)


def test_a_failing_step_raises_from_run_and_releases_its_pages(runtime):
    @sgl.function
    def bad(s):
        s += "Hello" + sgl.gen("ok", max_tokens=2)
        s += sgl.gen("broken", regex="(unclosed", max_tokens=2)
        s += sgl.gen("never", max_tokens=2)

    with pytest.raises(GrammarError):
        bad.run(temperature=0)
    assert_no_leaked_pages(runtime)


def test_an_error_in_the_program_function_stops_its_queued_steps(runtime):
    @sgl.function(jit=False)
    def crashes(s):
        s += "Hello" + sgl.gen("x", max_tokens=2)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        crashes.run()
    assert_no_leaked_pages(runtime)


def test_a_state_after_its_run_is_read_only():
    st = echo.run(word="z", temperature=0)
    with pytest.raises(sgl.SgjitError, match="has finished"):
        st += "more"


def test_backend_argument_and_registration(runtime):
    from sgjit.lang.runtime_backend import RuntimeBackend

    st = echo.run(word="q", temperature=0, backend=runtime)
    assert st.text().startswith("Repeat the word q")
    backend = RuntimeBackend.of(runtime)
    assert backend is RuntimeBackend.of(runtime) and backend.lookup_function("echo") is echo


def test_a_runtime_that_ran_programs_is_freed_after_shutdown(tmp_path):
    import gc
    import weakref

    from tiny_gguf import write_tiny_gguf

    rt = sgl.Runtime(str(write_tiny_gguf(tmp_path / "tiny.gguf")), device="cpu", max_total_tokens=512)
    assert echo.run(word="a", backend=rt).get_meta_info("more")["completion_tokens"] == 3
    ref = weakref.ref(rt)
    rt.shutdown()
    del rt
    gc.collect()
    assert ref() is None  # neither the function nor the backend adapter keeps it alive
