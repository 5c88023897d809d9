"""Faults inside a batch (issue 18 B.4a): a request whose forward step or grammar raises ends with
its own error while the requests batched with it finish as they would have alone; and the
autotune store survives a corrupt file (B.4b)."""

from __future__ import annotations

import logging
import queue

from sgjit.kernels.selector import AutotuneStore
from sgjit.runtime.result import RequestUpdate

from conftest import assert_no_leaked_pages

GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
PROMPTS = ["The sky is", "One, two, three,", "Paris is the capital of"]


def run_together(runtime, reqs) -> dict[str, RequestUpdate]:
    done: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
    runtime.submit_batch(reqs, lambda u: done.put(u) if u.finished else None)
    updates = [done.get(timeout=120) for _ in reqs]
    return {u.rid: u for u in updates}


def greedy_requests(runtime, params=GREEDY):
    return [runtime.make_request(runtime.encode_prompt(p), params) for p in PROMPTS]


def test_a_failing_forward_ends_only_its_request(runtime, monkeypatch, caplog):
    expected = [r.output_ids for r in runtime.run_requests(greedy_requests(runtime))]
    reqs = greedy_requests(runtime)
    poisoned = reqs[1]
    runner = runtime.engine.runner
    forward = runner.forward

    def failing_forward(rows):
        if any(row.req is poisoned for row in rows) and poisoned.num_output >= 2:
            raise RuntimeError("injected kernel launch failure")
        return forward(rows)

    monkeypatch.setattr(runner, "forward", failing_forward)
    with caplog.at_level(logging.WARNING, logger="sgjit.runtime.engine"):
        by_id = run_together(runtime, reqs)
    monkeypatch.undo()
    assert "injected kernel launch failure" in str(by_id[poisoned.rid].error)
    for i in (0, 2):
        u = by_id[reqs[i].rid]
        assert u.error is None and u.result.output_ids == expected[i], u
    assert any("rerunning them one by one" in r.message for r in caplog.records)
    assert runtime.run_requests(greedy_requests(runtime))[0].output_ids == expected[0]  # engine alive
    assert_no_leaked_pages(runtime)


def _with_multi_step(runtime, monkeypatch, forward_multi) -> None:
    """Make the CPU engine take its multi-step decode path, with `forward_multi` as the launch."""
    runner = runtime.engine.runner
    monkeypatch.setattr(type(runner), "multi_steps", property(lambda self: 3))
    monkeypatch.setattr(runner, "forward_multi", forward_multi)
    monkeypatch.setattr(runtime.engine, "multi_step_off", False)


def test_a_failing_multi_step_launch_reruns_rows_singly_and_turns_itself_off(runtime, monkeypatch, caplog):
    expected = [r.output_ids for r in runtime.run_requests(greedy_requests(runtime))]
    launches = []

    def broken(rows, *args):
        launches.append(len(rows))
        raise RuntimeError("injected multi-step graph failure")

    _with_multi_step(runtime, monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="sgjit.runtime.engine"):
        by_id = run_together(runtime, reqs := greedy_requests(runtime))
    assert launches, "the multi-step path was taken"
    for req, want in zip(reqs, expected):
        assert by_id[req.rid].error is None and by_id[req.rid].result.output_ids == want
    assert runtime.engine.multi_step_off is True  # single steps worked: the multi-step path is at fault
    assert any("turning it off" in r.message for r in caplog.records)
    monkeypatch.undo()
    assert_no_leaked_pages(runtime)


def test_a_request_failing_in_a_multi_step_launch_ends_alone(runtime, monkeypatch):
    expected = [r.output_ids for r in runtime.run_requests(greedy_requests(runtime))]
    reqs = greedy_requests(runtime)
    poisoned = reqs[1]
    forward = runtime.engine.runner.forward

    def multi(rows, *args):
        if any(row.req is poisoned for row in rows):
            raise RuntimeError("injected launch failure")
        return None  # "does not fit the graphs": the engine takes a single step

    def single(rows):
        if any(row.req is poisoned for row in rows) and poisoned.num_output >= 1:
            raise RuntimeError("injected launch failure")
        return forward(rows)

    _with_multi_step(runtime, monkeypatch, multi)
    monkeypatch.setattr(runtime.engine.runner, "forward", single)
    by_id = run_together(runtime, reqs)
    assert "injected launch failure" in str(by_id[poisoned.rid].error)
    for i in (0, 2):
        assert by_id[reqs[i].rid].error is None and by_id[reqs[i].rid].result.output_ids == expected[i]
    assert runtime.engine.multi_step_off is False  # a request was at fault, not the path
    monkeypatch.undo()
    assert_no_leaked_pages(runtime)


class FailingGrammar:
    """A grammar matcher that raises once the request has a few tokens (mid-generation)."""

    def __init__(self, inner, req):
        self._inner, self._req = inner, req

    def fill_bitmask(self, out):
        if self._req.num_output >= 2:
            raise RuntimeError("injected grammar failure")
        return self._inner.fill_bitmask(out)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_failing_grammar_ends_only_its_request(runtime):
    constrained = {**GREEDY, "regex": "[a-z ]{1,40}"}
    expected = [r.output_ids for r in runtime.run_requests(greedy_requests(runtime, constrained))]
    reqs = greedy_requests(runtime, constrained)
    reqs[0].grammar = FailingGrammar(reqs[0].grammar, reqs[0])
    by_id = run_together(runtime, reqs)
    assert "injected grammar failure" in str(by_id[reqs[0].rid].error)
    for i in (1, 2):
        u = by_id[reqs[i].rid]
        assert u.error is None and u.result.output_ids == expected[i], u
    assert_no_leaked_pages(runtime)


def test_corrupt_autotune_store_is_ignored_with_a_warning_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "autotune.json"
    AutotuneStore(path).put("k1", "tile_a")
    for garbage in (b"\x00\xff garbage", path.read_bytes()[:5], b"[1, 2]", b'{"k": 5}'):
        path.write_bytes(garbage)
        store = AutotuneStore(path)  # a fresh store, as a new process would make
        with caplog.at_level(logging.WARNING, logger="sgjit.kernels.selector"):
            caplog.clear()
            assert store.get("k1") is None
        assert any("ignoring" in r.message and str(path) in r.message for r in caplog.records), garbage
        store.put("k2", "tile_b")  # rebuilt from scratch
        assert AutotuneStore(path).load() == {"k2": "tile_b"}
