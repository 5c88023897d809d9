"""Unit tests of the step sampler (sgjit/runtime/sampler.py, over the torch reference ops on CPU), of
the engine's token-id finish checks (token_finish.py), of the output processor (output.py) and of
the output thread that runs it (output_thread.py). No
model: logits are made up, and a fake tokenizer maps each id to fixed bytes so decoded text is
predictable."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

import pytest
import torch

from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.logprobs import DeviceLogprobs, HostLogprobs
from sgjit.runtime.output import OutputProcessor, TokenUpdate
from sgjit.runtime.output_thread import OutputThread
from sgjit.runtime.request import PrefixHandle, Request
from sgjit.runtime.result import FinishReason, GenerateResult, RequestUpdate
from sgjit.runtime.sampler import RowSampling, Sampler
from sgjit.runtime.sampling_params import SamplingParams
from sgjit.runtime.token_finish import first_finish
from sgjit.runtime.tokenizer import IncrementalDetokenizer

EOS = 0
VOCAB: dict[int, bytes] = {
    EOS: b"</s>",
    1: b"Hello",
    2: b" world",
    3: b"!",
    4: b" STOP",
    5: b"ST",
    6: b"OP",
    7: b"\n",
    8: b"abc",
    9: b"x",
    10: b"\xc3",  # the first byte of "é"
    11: b"\xa9",  # its second byte
}
SPECIAL = frozenset({EOS})


class FakeTokenizer:
    """Ids decode to fixed byte strings, joined and read as UTF-8 (so a split character decodes to
    U+FFFD until its last byte arrives); special ids are dropped on request."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        data = b"".join(VOCAB[i] for i in ids if not (skip_special_tokens and i in SPECIAL))
        return data.decode("utf-8", errors="replace")


def _req(
    prompt: Sequence[int] = (1, 2),
    *,
    rid: str = "r",
    sink: list[RequestUpdate] | None = None,
    **params: object,
) -> Request:
    sp = SamplingParams(**params)  # type: ignore[arg-type]
    req = Request(
        rid,
        list(prompt),
        sp,
        IncrementalDetokenizer(FakeTokenizer(), sp.skip_special_tokens),  # type: ignore[arg-type]
        sink=sink.append if sink is not None else None,
    )
    req.stop_ids = sp.finishing_ids((EOS,))  # as the engine sets it on submission
    return req


# =============================== Sampler ===============================

V = 16


def _sampler(seed: int = 0, vocab: int = V) -> Sampler:
    return Sampler(REFERENCE_OPS, torch.device("cpu"), vocab, seed=seed)


def _with_output(req: Request, ids: Sequence[int]) -> Request:
    req.tokens.extend(ids)
    return req


def test_greedy_picks_argmax() -> None:
    """temperature 0 takes each row's argmax."""
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    reqs = [_req(temperature=0.0) for _ in range(4)]
    assert _sampler().sample(logits, reqs).tolist() == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_even_with_temperature() -> None:
    """top_k=1 makes a row greedy whatever its temperature: it always takes the argmax."""
    logits = torch.zeros(1, V)
    logits[0, 5] = 0.5  # barely ahead: plain sampling would often take something else
    req = _req(temperature=1.5, top_k=1)
    assert RowSampling.of([req]).temperature == [0.0]
    assert {_sampler(seed=s).sample(logits.clone(), [req]).tolist()[0] for s in range(30)} == {5}


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    """Greedy rows next to sampled rows still take their argmax."""
    logits = torch.zeros(3, V)
    logits[0, 7] = 0.1
    logits[2, 2] = 0.1
    reqs = [_req(temperature=0.0), _req(temperature=1.0), _req(temperature=0.0)]
    for s in range(10):
        out = _sampler(seed=s).sample(logits.clone(), reqs).tolist()
        assert out[0] == 7 and out[2] == 2


def test_sampling_is_not_greedy_on_a_flat_distribution() -> None:
    """With temperature 1 over equal logits, sampling spreads over the vocabulary."""
    logits = torch.zeros(1, V)
    draws = {_sampler(seed=s).sample(logits.clone(), [_req(temperature=1.0)])[0].item() for s in range(40)}
    assert len(draws) > 4


def _seeded_run(seed: int, neighbours: list[Request], steps: int = 8, vocab: int = 1000) -> list[int]:
    """Tokens a seeded request draws over `steps` steps over flat logits, batched with `neighbours`."""
    req = _req(temperature=1.0, seed=seed)
    sampler = _sampler(seed=len(neighbours) * 31 + 5, vocab=vocab)
    out = []
    for _ in range(steps):
        batch = [*neighbours, req]
        toks = sampler.sample(torch.zeros(len(batch), vocab), batch).tolist()
        out.append(toks[-1])
        req.tokens.append(toks[-1])  # its step counter advances with its output
        for n in neighbours:
            n.tokens.append(toks[0])
    return out


def test_seeded_row_is_reproducible_and_independent_of_neighbours() -> None:
    """A seeded row draws the same tokens alone or next to other rows (seeded or not), and whatever the
    sampler's own seed; the draws change from step to step and with the seed."""
    alone = _seeded_run(7, [])
    assert alone == _seeded_run(7, [])
    crowd = [_req(temperature=1.0), _req(temperature=0.7, seed=123), _req(temperature=0.0)]
    assert _seeded_run(7, crowd) == alone
    assert len(set(alone)) > 1  # the step is part of the seed
    assert _seeded_run(8, []) != alone


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    """Unseeded rows are reproducible for one sampler seed and differ for another."""
    logits = torch.zeros(6, 1000)
    reqs = [_req(temperature=1.0) for _ in range(6)]
    a = _sampler(seed=3, vocab=1000).sample(logits.clone(), reqs).tolist()
    b = _sampler(seed=3, vocab=1000).sample(logits.clone(), reqs).tolist()
    c = _sampler(seed=4, vocab=1000).sample(logits.clone(), reqs).tolist()
    assert a == b
    assert a != c


def test_top_k_top_p_min_p_limit_the_candidates() -> None:
    """Sampling never leaves the top-k set, the top-p nucleus or the min-p band."""
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.3, 0.2, 0.05] + [1e-9] * (V - 5)]))
    cases = [({"top_k": 2}, {1, 2}), ({"top_p": 0.5}, {1, 2}), ({"min_p": 0.6}, {1, 2})]
    for extra, allowed in cases:
        req = _req(temperature=1.0, **extra)
        seen = {_sampler(seed=s).sample(logits.clone(), [req]).tolist()[0] for s in range(60)}
        assert seen <= allowed, extra
        assert seen == allowed, extra  # both candidates are drawn at some point


def test_process_logits_drops_padding_columns_in_place() -> None:
    """Logits wider than the vocabulary are cut to it, and the processing writes into the step's tensor."""
    logits = torch.zeros(2, V + 4)
    reqs = [_req(min_new_tokens=1), _req()]
    out = _sampler().process_logits(logits, reqs, (EOS,))
    assert out.shape == (2, V)
    assert out.data_ptr() == logits.data_ptr()
    assert logits[0, EOS] == -math.inf


def test_frequency_and_presence_penalties_count_output_tokens() -> None:
    """logit -= frequency * count + presence * (count > 0), over the output tokens only (prompt tokens
    are not penalised)."""
    req = _with_output(_req(prompt=[1, 1, 2], frequency_penalty=0.5, presence_penalty=0.25), [3, 3, 4])
    out = _sampler().process_logits(torch.zeros(1, V), [req], (EOS,))[0]
    expected = torch.zeros(V)
    expected[3] = -(0.5 * 2 + 0.25)
    expected[4] = -(0.5 * 1 + 0.25)
    torch.testing.assert_close(out, expected)


def test_negative_frequency_penalty_raises_logits() -> None:
    """A negative frequency penalty makes repeated tokens more likely."""
    req = _with_output(_req(frequency_penalty=-1.0), [6, 6])
    out = _sampler().process_logits(torch.zeros(1, V), [req], (EOS,))[0]
    assert out[6] == pytest.approx(2.0)
    assert out[5] == 0.0


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    """repetition_penalty p: a seen token's logit l becomes l / p if positive, l * p if not; seen means
    prompt or output; unseen tokens keep their logits."""
    base = torch.linspace(-2.0, 2.0, V)[None, :]
    prompt = [0, 15]  # logits -2 and 2
    req = _with_output(_req(prompt=prompt, repetition_penalty=2.0), [3, 12])
    out = _sampler().process_logits(base.clone(), [req], ())[0]
    seen = {0, 15, 3, 12}
    for t in range(V):
        v = base[0, t].item()
        want = (v / 2.0 if v > 0 else v * 2.0) if t in seen else v
        assert out[t].item() == pytest.approx(want), t


def test_penalties_leave_other_rows_alone() -> None:
    """A penalised row does not touch its neighbours."""
    penalised = _with_output(_req(frequency_penalty=1.0), [2])
    plain = _with_output(_req(), [2])
    out = _sampler().process_logits(torch.zeros(2, V), [penalised, plain], (EOS,))
    assert out[0, 2] == -1.0
    assert torch.all(out[1] == 0.0)


def test_min_new_tokens_blocks_eos_and_stop_tokens() -> None:
    """Until min_new_tokens tokens exist, EOS and stop_token_ids are -inf, so even greedy sampling picks
    something else; afterwards nothing is blocked."""
    logits = torch.zeros(1, V)
    logits[0, EOS] = 5.0
    logits[0, 9] = 4.0
    logits[0, 3] = 1.0
    req = _req(temperature=0.0, min_new_tokens=2, stop_token_ids=[9])
    sampler = _sampler()
    for _ in range(2):
        out = sampler.process_logits(logits.clone(), [req], (EOS,))
        assert out[0, EOS] == -math.inf and out[0, 9] == -math.inf
        assert torch.isfinite(out[0, 1:9]).all()
        tok = sampler.sample(out, [req]).tolist()[0]
        assert tok == 3
        req.tokens.append(tok)
    out = sampler.process_logits(logits.clone(), [req], (EOS,))
    torch.testing.assert_close(out, logits)
    assert sampler.sample(out, [req]).tolist() == [EOS]


def test_min_new_tokens_with_ignore_eos_blocks_only_stop_tokens() -> None:
    """With ignore_eos, EOS is an ordinary token and only the stop tokens are blocked."""
    req = _req(min_new_tokens=3, ignore_eos=True, stop_token_ids=[4])
    out = _sampler().process_logits(torch.zeros(1, V), [req], (EOS, 1))
    assert out[0, 4] == -math.inf
    assert out[0, EOS] == 0.0 and out[0, 1] == 0.0


# =========================== OutputProcessor ===========================

MAX_LEN = 64


def _proc() -> OutputProcessor:
    return OutputProcessor(FakeTokenizer())  # type: ignore[arg-type]


def _feed(
    proc: OutputProcessor, req: Request, toks: Sequence[int], max_model_len: int = MAX_LEN
) -> FinishReason | None:
    """Hand tokens over one at a time as the engine does: its id checks (`first_finish`), then the
    output processor's text (streaming after each token that does not end the request), a stop
    string found there ending the request; the finish reason of the token that ended it (then it
    is finished), or None."""
    for i, t in enumerate(toks):
        base = len(req.tokens)
        req.tokens.append(t)
        _, reason = first_finish(req, base, [t], max_model_len)
        proc.take(TokenUpdate(req, [t], reason))
        if req.text_stop is not None:
            reason = req.text_stop[1]
        if reason is not None:
            assert i == len(toks) - 1, "finished before the last token fed"
            req.finish_reason = reason
            proc.finish(req, None, None)
            return reason
    return None


def _final(updates: list[RequestUpdate]) -> GenerateResult:
    assert updates and updates[-1].finished
    assert all(not u.finished for u in updates[:-1])
    result = updates[-1].result
    assert result is not None
    return result


def test_plain_tokens_grow_the_text_and_do_not_finish() -> None:
    """Ordinary tokens are appended and decoded; nothing ends the request."""
    proc = _proc()
    req = _req(max_new_tokens=10)
    assert _feed(proc, req, [1, 2, 3]) is None
    assert req.output_ids == [1, 2, 3]
    assert req.detokenizer.text == "Hello world!"


def test_eos_finishes_with_stop_and_builds_the_result() -> None:
    """EOS ends the sequence as stop(EOS); the final update carries the rest of the text, every output
    token and a complete GenerateResult (EOS text skipped as a special token)."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(prompt=[9, 9, 9], rid="req-eos", sink=updates, max_new_tokens=10)
    req.cached_tokens = 2
    reason = _feed(proc, req, [1, 2, EOS])
    assert reason == FinishReason.stop(EOS)
    res = _final(updates)
    assert res.rid == "req-eos"
    assert res.text == "Hello world"
    assert res.output_ids == [1, 2, EOS]
    assert res.prompt_tokens == 3 and res.completion_tokens == 3 and res.cached_tokens == 2
    assert res.finish_reason == FinishReason.stop(EOS)
    assert res.finish_reason.to_dict() == {"type": "stop", "matched": EOS}
    assert res.e2e_latency >= 0.0
    assert res.logprobs is None
    assert "".join(u.text for u in updates) == res.text
    assert [t for u in updates for t in u.token_ids] == [1, 2, EOS]
    assert updates[-1].error is None and updates[-1].handle is None


def test_ignore_eos_keeps_going() -> None:
    """With ignore_eos, EOS does not end the sequence."""
    proc = _proc()
    req = _req(max_new_tokens=10, ignore_eos=True, skip_special_tokens=False)
    assert _feed(proc, req, [1, EOS, 2]) is None
    assert req.detokenizer.text == "Hello</s> world"


def test_stop_token_ids_finish_even_with_ignore_eos() -> None:
    """A stop token id ends the sequence as stop(that id), ignore_eos or not, and stays in output_ids."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, ignore_eos=True, stop_token_ids=[3])
    assert _feed(proc, req, [1, 2, 3]) == FinishReason.stop(3)
    res = _final(updates)
    assert res.output_ids == [1, 2, 3]
    assert res.finish_reason.matched == 3


def test_stop_string_inside_one_token_is_trimmed() -> None:
    """A stop string ends the sequence as stop(string) and is cut from the result text."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=[" STOP"])
    assert _feed(proc, req, [1, 2, 4]) == FinishReason.stop(" STOP")
    res = _final(updates)
    assert res.text == "Hello world"
    assert res.output_ids == [1, 2, 4]
    assert "".join(u.text for u in updates) == "Hello world"


def test_stop_string_across_tokens() -> None:
    """A stop string split over two tokens is found when its last part arrives."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["STOP"])
    assert _feed(proc, req, [1, 5]) is None
    assert _feed(proc, req, [6]) == FinishReason.stop("STOP")
    assert _final(updates).text == "Hello"


def test_stop_string_trimmed_with_text_after_it_in_the_token() -> None:
    """Text after the stop string in the same token is cut along with it."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["b"])
    assert _feed(proc, req, [1, 8]) == FinishReason.stop("b")
    assert _final(updates).text == "Helloa"


def test_no_stop_trim_keeps_the_stop_string() -> None:
    """With no_stop_trim, the matched stop string stays in the result text."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["STOP"], no_stop_trim=True)
    assert _feed(proc, req, [1, 5, 6]) == FinishReason.stop("STOP")
    res = _final(updates)
    assert res.text == "HelloSTOP"
    assert "".join(u.text for u in updates) == "HelloSTOP"


def test_earliest_stop_string_wins() -> None:
    """When several stop strings appear, the one starting first is the match."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["world", "o w"])
    assert _feed(proc, req, [1, 2]) == FinishReason.stop("o w")
    assert _final(updates).text == "Hell"


def test_stop_string_in_the_prompt_does_not_stop() -> None:
    """Only generated text is searched: a stop string in the prompt is not a match."""
    proc = _proc()
    req = _req(prompt=[4, 4], max_new_tokens=10, stop=[" STOP"])
    assert _feed(proc, req, [1, 2]) is None


def test_stream_holds_back_a_possible_stop_string_prefix() -> None:
    """stream hands out text except the last len(longest stop) - 1 characters, so the start of a stop
    string is never sent; updates add up to the result, and tokens whose text is held ride along with
    the next update."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["STOP", "!"])
    proc.accept(req, 1)  # "Hello"
    proc.stream(req)
    assert [u.text for u in updates] == ["He"]
    proc.accept(req, 2)  # "Hello world"
    proc.stream(req)
    assert [u.text for u in updates] == ["He", "llo wo"]
    proc.accept(req, 5)  # "Hello worldST": "ST" may begin "STOP"
    proc.stream(req)
    assert "".join(u.text for u in updates) == "Hello worl"
    assert "S" not in "".join(u.text for u in updates)
    reason = proc.accept(req, 6)
    assert reason == FinishReason.stop("STOP")
    req.finish_reason = reason
    proc.finish(req, None, None)
    assert "".join(u.text for u in updates) == "Hello world" == _final(updates).text
    assert [t for u in updates for t in u.token_ids] == [1, 2, 5, 6]


def test_stream_without_stop_strings_sends_everything() -> None:
    """With no stop strings, all decoded text goes out at once, one update a token."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10)
    _feed(proc, req, [1, 2, 3])
    assert [(u.text, u.token_ids) for u in updates] == [("Hello", [1]), (" world", [2]), ("!", [3])]


def test_stream_never_splits_a_character() -> None:
    """Half of a UTF-8 character is held (its token rides with the next update); a character left
    incomplete at the end is flushed by finish."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=3)
    _feed(proc, req, [1, 10])
    assert [u.text for u in updates] == ["Hello"]
    _feed(proc, req, [11])  # the third token reaches max_new_tokens
    assert "".join(u.text for u in updates) == "Helloé"
    assert [u.token_ids for u in updates] == [[1], [10, 11]]
    updates.clear()
    req2 = _req(sink=updates, max_new_tokens=2)
    assert _feed(proc, req2, [1, 10]) == FinishReason.at_length(2)
    assert _final(updates).text == "Hello\ufffd"


def test_stream_without_sink_is_harmless() -> None:
    """A request with no sink streams nothing and loses nothing."""
    proc = _proc()
    req = _req(max_new_tokens=10)
    proc.accept(req, 1)
    proc.stream(req)
    assert req.released_chars == 0 and req.released_tokens == 0


def test_max_new_tokens_finishes_with_length() -> None:
    """The max_new_tokens-th token ends the sequence as length(max_new_tokens)."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=3)
    assert _feed(proc, req, [1, 2]) is None
    assert _feed(proc, req, [3]) == FinishReason.at_length(3)
    res = _final(updates)
    assert res.finish_reason.to_dict() == {"type": "length", "length": 3}
    assert res.completion_tokens == 3 and res.text == "Hello world!"


def test_stop_beats_length_on_the_last_token() -> None:
    """EOS as the last allowed token reports stop, not length."""
    proc = _proc()
    req = _req(max_new_tokens=2)
    assert _feed(proc, req, [1, EOS]) == FinishReason.stop(EOS)


def test_context_length_finishes_with_length() -> None:
    """Reaching the model's context length ends the sequence as length, with the output token count."""
    proc = _proc()
    req = _req(prompt=[1, 2, 3], max_new_tokens=100)
    assert _feed(proc, req, [9], max_model_len=5) is None
    assert _feed(proc, req, [9], max_model_len=5) == FinishReason.at_length(2)
    assert len(req.tokens) == 5


def test_finish_with_error_sends_no_result() -> None:
    """An aborted request's final update has the error and no result, plus the text not yet sent."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["xyz"])
    proc.accept(req, 1)
    proc.stream(req)
    err = RuntimeError("boom")
    req.finish_reason = FinishReason.abort("boom")
    proc.finish(req, err, None)
    last = updates[-1]
    assert last.finished and last.result is None and last.error is err
    assert "".join(u.text for u in updates) == "Hello"


def test_finish_passes_the_prefix_handle() -> None:
    """The handle given to finish reaches the submitter with the final update."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=1)
    handle = PrefixHandle([1, 2, 3], [5])
    req.tokens.append(3)
    _, reason = first_finish(req, len(req.tokens) - 1, [3], MAX_LEN)
    proc.take(TokenUpdate(req, [3], reason))
    assert reason is not None
    req.finish_reason = reason
    proc.finish(req, None, handle)
    assert updates[-1].handle is handle
    assert _final(updates).to_dict()["meta_info"]["finish_reason"] == {"type": "length", "length": 1}


def test_output_logprobs_are_the_log_softmax_of_the_chosen_tokens() -> None:
    """The engine's device logprobs, read back and handed over with the token, become
    log_softmax(logits)[token] with the top-n alternatives and token text when asked."""
    proc = _proc()
    a = Request(
        "a", [1], SamplingParams(max_new_tokens=1), IncrementalDetokenizer(FakeTokenizer()),  # type: ignore[arg-type]
        return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True,
    )  # fmt: skip
    logits = torch.zeros(1, len(VOCAB))
    logits[0, 2] = 3.0
    logits[0, 1] = 1.0
    values = DeviceLogprobs.of(torch.log_softmax(logits, -1), torch.tensor([1]), a.top_logprobs_num)
    raw = HostLogprobs.read(values, iter(values.tensors()))
    proc.take(TokenUpdate(a, [1], output_logprobs=raw))
    assert a.logprobs is not None
    lp = torch.log_softmax(logits[0], -1)
    ((value, tok, text),) = a.logprobs.output_token_logprobs
    assert tok == 1 and text == "Hello" and value == pytest.approx(lp[1].item())
    ((top1, top2),) = a.logprobs.output_top_logprobs
    assert (top1[1], top2[1]) == (2, 1) and top1[2] == " world"
    assert top1[0] == pytest.approx(lp[2].item())


def test_input_logprobs_are_recorded_from_the_position_given() -> None:
    """Prompt logprobs handed over with a launch: with `with_first` the prompt's first token comes
    first with no value; each later prompt token gets log_softmax(logits at the position before)."""
    proc = _proc()
    req = Request(
        "p", [1, 2, 3], SamplingParams(max_new_tokens=1), IncrementalDetokenizer(FakeTokenizer()),  # type: ignore[arg-type]
        return_logprob=True, logprob_start_len=0, top_logprobs_num=1,
    )  # fmt: skip
    logits = torch.randn(2, len(VOCAB), generator=torch.Generator().manual_seed(3))
    lps = torch.log_softmax(logits, -1)
    values = DeviceLogprobs.of(lps, torch.tensor([2, 3]), req.top_logprobs_num)  # targets: prompt[1:]
    raw = HostLogprobs.read(values, iter(values.tensors()))
    proc.take(TokenUpdate(req, [], input_logprobs=(0, raw, True)))
    assert req.logprobs is not None
    got = req.logprobs.input_token_logprobs
    assert [(t, text) for _, t, text in got] == [(1, None), (2, None), (3, None)]
    assert got[0][0] is None
    assert got[1][0] == pytest.approx(lps[0, 2].item()) and got[2][0] == pytest.approx(lps[1, 3].item())
    tops = req.logprobs.input_top_logprobs
    assert tops[0] is None and [row[0][1] for row in tops[1:]] == lps.argmax(-1).tolist()
    assert req.detokenizer.ids == []  # prompt logprobs decode no output text


def test_a_multi_token_update_stops_at_a_stop_string_inside_it() -> None:
    """A multi-step launch hands over several tokens at once: the stop string is found at the token
    that completes it, whose index in `req.tokens` is reported for the engine to trim at, and the
    tokens after it are not decoded or streamed."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=["STOP"])
    req.tokens += [1, 5, 6, 2]
    proc.take(TokenUpdate(req, [1, 5, 6, 2]))
    assert req.text_stop == (req.prompt_len + 2, FinishReason.stop("STOP"))
    assert req.detokenizer.ids == [1, 5, 6]
    assert "".join(u.text for u in updates) == "Hell"  # after "HelloST": 3 characters held ("STOP" - 1)
    proc.take(TokenUpdate(req, [3]))  # a later launch's tokens (already in flight) are ignored
    assert req.detokenizer.ids == [1, 5, 6]
    req.finish_reason = req.text_stop[1]
    proc.finish(req, None, None)
    res = _final(updates)
    assert res.text == "Hello" and res.output_ids == [1, 5, 6]


def test_a_stop_string_before_the_engines_finish_wins() -> None:
    """The engine cut a launch's tokens at EOS; a stop string earlier in them is the finish."""
    proc = _proc()
    req = _req(max_new_tokens=10, stop=[" STOP"])
    proc.take(TokenUpdate(req, [1, 4, EOS], ends=FinishReason.stop(EOS)))
    assert req.text_stop == (req.prompt_len + 1, FinishReason.stop(" STOP"))
    assert req.detokenizer.ids == [1, 4]


def test_a_stop_token_ends_before_a_stop_string_in_its_own_text() -> None:
    """A stop token whose text completes a stop string ends as stop(token), untrimmed, as the plain
    per-token check always did."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop=[" STOP"], stop_token_ids=[4])
    assert _feed(proc, req, [1, 4]) == FinishReason.stop(4)
    assert req.text_stop is None
    assert _final(updates).text == "Hello STOP"


def test_first_finish_takes_the_earliest_token_and_the_plain_order_on_ties() -> None:
    """Over a launch's tokens the first ending one wins; at one token, a stop token or EOS beats the
    length limits (as a single step checks them)."""
    req = _req(prompt=[1, 2], max_new_tokens=3)
    base = len(req.tokens)
    assert first_finish(req, base, [1, EOS, 2], MAX_LEN) == (1, FinishReason.stop(EOS))
    assert first_finish(req, base, [1, 2, 3, 4], MAX_LEN) == (2, FinishReason.at_length(3))
    assert first_finish(req, base, [1, 2, EOS, 4], MAX_LEN) == (2, FinishReason.stop(EOS))
    assert first_finish(req, base, [1, 2], MAX_LEN) == (None, None)
    ctx = _req(prompt=[1, 2, 3], max_new_tokens=100)  # max_model_len 5: two output tokens fit
    assert first_finish(ctx, 3, [9, 9, 9], 5) == (1, FinishReason.at_length(2))
    eos_ignored = _req(max_new_tokens=10, ignore_eos=True, stop_token_ids=[7])
    assert first_finish(eos_ignored, 2, [EOS, 3, 7, EOS], MAX_LEN) == (2, FinishReason.stop(7))


class _RecordingGrammar:
    """A grammar that accepts anything and is finished once it has taken token 8."""

    def __init__(self) -> None:
        self.taken: list[int] = []

    def accept(self, tok: int) -> None:
        self.taken.append(tok)

    def is_finished(self) -> bool:
        return bool(self.taken) and self.taken[-1] == 8


def test_first_finish_advances_the_grammar_only_up_to_the_end() -> None:
    """The grammar takes the tokens up to the first finish (a stop token's included) and no further;
    its own end is a stop with no matched token."""
    req = _req(max_new_tokens=10)
    req.grammar = _RecordingGrammar()
    assert first_finish(req, 2, [1, 8, 3], MAX_LEN) == (1, FinishReason.stop(None))
    assert req.grammar.taken == [1, 8]
    stopped = _req(max_new_tokens=10, stop_token_ids=[3])
    stopped.grammar = _RecordingGrammar()
    assert first_finish(stopped, 2, [1, 3, 8], MAX_LEN) == (1, FinishReason.stop(3))
    assert stopped.grammar.taken == [1, 3]


# ============================ OutputThread ============================


def test_output_thread_hands_out_in_order_and_a_barrier_waits_for_it() -> None:
    """Updates reach the sinks in the order queued, on the output thread; after `barrier` every
    queued update has been handed out, and a stop string found there is visible to the caller."""
    got: list[tuple[str, str, str]] = []

    def sink(tag: str) -> Callable[[RequestUpdate], None]:
        return lambda u: got.append((tag, u.text, threading.current_thread().name))

    failures: list[tuple[Request, Exception]] = []
    out = OutputThread(_proc(), lambda r, e: failures.append((r, e)))
    try:
        a = _req(rid="a", max_new_tokens=10)
        b = _req(rid="b", max_new_tokens=10, stop=["!"])
        a.sink, b.sink = sink("a"), sink("b")
        out.deliver([TokenUpdate(a, [1]), TokenUpdate(b, [1])])
        out.deliver([TokenUpdate(a, [2]), TokenUpdate(b, [2, 3, 2])])
        out.barrier()
        want = [("a", "Hello"), ("b", "Hello"), ("a", " world"), ("b", " world")]
        assert [(t, x) for t, x, _ in got] == want
        assert {name for _, _, name in got} == {"sgjit-output"}
        assert b.text_stop == (b.prompt_len + 2, FinishReason.stop("!"))
        b.finish_reason = b.text_stop[1]
        out.finish(b, None, None)
        out.barrier()
        assert got[-1][:2] == ("b", "")
        assert not failures
    finally:
        out.stop()


def test_held_hand_out_waits_for_flush_and_keeps_its_order() -> None:
    """With `hold` (overlap scheduling) nothing queued reaches a sink until the engine flushes (it is
    about to block), and then in the order queued, the final update last; a barrier flushes first."""
    got: list[str] = []
    out = OutputThread(_proc(), lambda r, e: None)
    out.hold = True
    try:
        a = _req(rid="a", max_new_tokens=10)
        a.sink = lambda u: got.append(u.text)
        out.deliver([TokenUpdate(a, [1])])
        out.deliver([TokenUpdate(a, [2])])
        time.sleep(0.05)
        assert got == []  # held
        out.flush()
        a.finish_reason = FinishReason.at_length(2)
        out.finish(a, None, None)
        out.barrier()
        assert got == ["Hello", " world", ""]
    finally:
        out.stop()


def test_output_thread_reports_a_failing_sink_and_goes_on() -> None:
    """A sink that raises is reported through `on_failure` (the engine then ends that request); the
    other requests' updates are still handed out, and a final update that raises is only logged."""
    failures: list[tuple[str, str]] = []
    out = OutputThread(_proc(), lambda r, e: failures.append((r.rid, str(e))))
    seen: list[str] = []

    def bad(u: RequestUpdate) -> None:
        raise RuntimeError("sink broke")

    try:
        a = _req(rid="a", max_new_tokens=10)
        b = _req(rid="b", max_new_tokens=10)
        a.sink, b.sink = bad, lambda u: seen.append(u.text)
        out.deliver([TokenUpdate(a, [1]), TokenUpdate(b, [1])])
        a.finish_reason = FinishReason.abort("sink broke")
        out.finish(a, RuntimeError("sink broke"), None)  # raises inside: logged, not fatal
        out.deliver([TokenUpdate(b, [2])])
        out.barrier()
        assert failures == [("a", "sink broke")]
        assert seen == ["Hello", " world"]
    finally:
        out.stop()


# ======================= SGLang's extra sampling keys =======================


def test_stop_regex_finishes_and_trims_and_the_stream_agrees() -> None:
    """A stop regex ends the sequence at its match (trimmed, or kept with no_stop_trim), and the
    text streamed before the finish is a prefix of the result (held back while a match may come)."""
    updates: list[RequestUpdate] = []
    proc = _proc()
    req = _req(sink=updates, max_new_tokens=10, stop_regex=["lo w"])
    assert _feed(proc, req, [1, 2]) == FinishReason.stop("lo w")
    result = _final(updates)
    assert result.text == "Hel"
    assert "".join(u.text for u in updates) == "Hel"
    kept = _req(max_new_tokens=10, stop_regex=[r"w\w+"], no_stop_trim=True)
    sink: list[RequestUpdate] = []
    kept.sink = sink.append
    assert _feed(proc, kept, [1, 2]) == FinishReason.stop("world")
    assert _final(sink).text == "Hello world"


def test_stop_regex_that_matches_nothing_is_refused() -> None:
    """A pattern that matches the empty string would stop at the first token: an error instead."""
    from sgjit.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="stop_regex"):
        SamplingParams.from_dict({"stop_regex": "x*"})
    with pytest.raises(InvalidRequestError, match="stop_regex"):
        SamplingParams.from_dict({"stop_regex": "("})


def test_logit_bias_moves_the_argmax() -> None:
    """logit_bias adds to the named tokens' logits before sampling (string keys, as JSON sends them)."""
    sampler = _sampler()
    logits = torch.zeros(1, V)
    logits[0, 3] = 5.0
    req = _req(temperature=0.0, max_new_tokens=4)
    req.params = SamplingParams.from_dict({"temperature": 0, "logit_bias": {"7": 10.0, "3": -100}})
    out = sampler.process_logits(logits, [req], (EOS,))
    assert out[0, 7] == 10.0 and out[0, 3] == -95.0
    assert sampler.sample(out, [req]).tolist() == [7]


def test_sampling_seed_is_seed_and_the_frontends_extras_are_accepted() -> None:
    """SGLang's frontend sends sampling_seed, spaces_between_special_tokens, stream_interval and
    custom_params: accepted (the seed used as the seed); structural_tag is refused with a message."""
    from sgjit.errors import InvalidRequestError

    sp = SamplingParams.from_dict(
        {"sampling_seed": 7, "spaces_between_special_tokens": False, "stream_interval": 4, "custom_params": {},
         "stop_regex": None, "n": 1}
    )  # fmt: skip
    assert sp.seed == 7 and sp.sampling_seed is None
    with pytest.raises(InvalidRequestError, match="seed"):
        SamplingParams.from_dict({"sampling_seed": 7, "seed": 8})
    with pytest.raises(InvalidRequestError, match="structural_tag"):
        SamplingParams.from_dict({"structural_tag": "{}"})


def test_two_output_constraints_conflict() -> None:
    """regex, json_schema, choices and ebnf are each valid alone; two at once is a conflict (the
    server's conflicting_parameters), naming them, even when one of them is empty."""
    from sgjit.errors import ConflictingParamsError

    with pytest.raises(ConflictingParamsError, match=r"\['choices', 'ebnf'\].*only one"):
        SamplingParams.from_dict({"choices": [""], "ebnf": ""})
    with pytest.raises(ConflictingParamsError, match="regex"):
        SamplingParams.from_dict({"regex": "a+", "json_schema": "{}"})
