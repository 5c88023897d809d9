"""`OutputProcessor`: what happens to tokens once the engine has read them back, on the output thread
(output_thread.py) — the text grows, stop strings and stop regexes are looked for, logprobs become
entries, and text is handed to the submitter as it becomes final (the last `len(longest stop) - 1`
characters are held back, since a stop string may still begin there). On finish it builds the
`GenerateResult`.

The engine decides everything a token id alone decides (stop tokens, EOS, length, a grammar's end)
and cuts the tokens it hands over after the first such finish; a stop string or regex found here is
reported back through `Request.text_stop`, and the engine finishes the request with it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sgjit.runtime.logprobs import HostLogprobs
from sgjit.runtime.request import PrefixHandle, Request
from sgjit.runtime.result import FinishReason, GenerateResult, RequestUpdate
from sgjit.runtime.tokenizer import Tokenizer

# Characters held back from the stream while a stop regex could still match (a match longer than
# this that began in text already streamed is not seen: streamed text is never taken back).
STOP_REGEX_HOLD_CHARS = 64


@dataclass(slots=True)
class TokenUpdate:
    """What one launch produced for one request, as the engine hands it to the output thread."""

    req: Request
    tokens: list[int]
    # the engine's finish at the last token (a stop token, EOS, length, the grammar's end), or None
    ends: FinishReason | None = None
    input_logprobs: tuple[int, HostLogprobs, bool] | None = None  # (first position, values, with token 0)
    output_logprobs: HostLogprobs | None = None  # one entry a token


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def take(self, u: TokenUpdate) -> None:
        """Record a launch's logprobs and tokens for one request, streaming after every token that
        does not end it; stops at a stop string or regex (later tokens are the engine's to trim)."""
        req = u.req
        if req.text_stop is not None:
            return
        if u.input_logprobs is not None:
            self._record_input_logprobs(req, *u.input_logprobs)
        if not u.tokens:
            return
        if u.output_logprobs is None and not req.params.stop and not req.params.stop_regex:
            # nothing to find between the tokens: one decode for the whole launch (a multi-step launch
            # hands 8 tokens a row), and one update
            req.detokenizer.push(u.tokens)
            if u.ends is None:
                self.stream(req)
            return
        last = len(u.tokens) - 1
        for k, tok in enumerate(u.tokens):
            if u.output_logprobs is not None:
                self._record_output_logprob(req, u.output_logprobs, k, tok)
            ends = u.ends if k == last else None
            # a stop token ends the sequence before any stop string can (as the engine checks them)
            if self.accept(req, tok, check_text=ends is None or not isinstance(ends.matched, int)):
                return
            if ends is None:
                self.stream(req)

    # ----- logprobs -----
    def _text_fn(self, req: Request) -> Callable[[int], str] | None:
        return (lambda t: self.tokenizer.decode([t])) if req.return_text_in_logprobs else None

    def _record_input_logprobs(
        self, req: Request, first_pos: int, raw: HostLogprobs, with_first: bool
    ) -> None:
        """Logprobs of the prompt tokens after positions `first_pos ...`; `with_first`: the prompt's
        first token too (it has no logprob)."""
        lp = req.logprobs
        assert lp is not None, "only requests that return logprobs have prompt rows to record"
        text = self._text_fn(req)
        if with_first:
            first = req.prompt_ids[0]
            lp.input_token_logprobs.append((None, first, text(first) if text else None))
            lp.input_top_logprobs.append(None)
        targets = req.prompt_ids[first_pos + 1 : first_pos + 1 + len(raw.chosen)]
        entries, tops = raw.entries(targets, text)
        lp.input_token_logprobs.extend(entries)
        lp.input_top_logprobs.extend(tops if tops is not None else [None] * len(entries))

    def _record_output_logprob(self, req: Request, raw: HostLogprobs, k: int, tok: int) -> None:
        lp = req.logprobs
        assert lp is not None, "only requests that return logprobs have output logprobs"
        one = HostLogprobs(raw.chosen[k : k + 1], None if raw.tops is None else raw.tops[k : k + 1])
        entries, tops = one.entries([tok], self._text_fn(req))
        lp.output_token_logprobs.extend(entries)
        if tops is not None:
            lp.output_top_logprobs.extend(tops)

    # ----- text -----
    def accept(self, req: Request, tok: int, check_text: bool = True) -> FinishReason | None:
        """Decode one more token; with `check_text`, the stop string or regex the new text completes
        (also recorded in `req.text_stop`, with the trim), or None."""
        p = req.params
        old_len = len(req.detokenizer.text)
        req.detokenizer.push([tok])
        if not check_text:
            return None
        reason = None
        text = req.detokenizer.text
        if p.stop:
            longest = max(len(s) for s in p.stop)
            window_start = max(0, old_len - longest + 1)
            hits = [(i, s) for s in p.stop if (i := text.find(s, window_start)) >= 0]
            if hits:
                i, s = min(hits)
                req.stop_trim = len(text) - (i + len(s) if p.no_stop_trim else i)
                reason = FinishReason.stop(s)
        if reason is None:
            for (
                pattern
            ) in p.stop_regex:  # a match must start in text not yet streamed (streamed text is final)
                if (m := re.compile(pattern).search(text, req.released_chars)) is not None:
                    req.stop_trim = len(text) - (m.end() if p.no_stop_trim else m.start())
                    reason = FinishReason.stop(m.group(0))
                    break
        if reason is not None:
            req.text_stop = (req.prompt_len + len(req.detokenizer.ids) - 1, reason)
        return reason

    def stream(self, req: Request) -> None:
        """Hand the submitter the text that no stop string can still claim."""
        if req.sink is None:
            return
        text = req.detokenizer.text
        hold = max((len(s) for s in req.params.stop), default=1) - 1
        if req.params.stop_regex:
            hold = max(hold, STOP_REGEX_HOLD_CHARS)
        upto = len(text) - hold
        if upto > req.released_chars:
            delta = text[req.released_chars : upto]
            req.released_chars = upto
            req.emit(RequestUpdate(req.rid, delta, _unreleased_tokens(req)))

    def finish(self, req: Request, error: Exception | None, handle: PrefixHandle | None) -> None:
        """The final update: the rest of the text, and the result (or the error). The engine set
        `req.finish_reason`."""
        req.detokenizer.flush()
        text = req.detokenizer.text
        if req.stop_trim:
            text = text[: len(text) - req.stop_trim]
        delta = text[req.released_chars :] if len(text) > req.released_chars else ""
        req.released_chars = len(text)
        result = None if error is not None else _result(req, text)
        tokens = _unreleased_tokens(req)
        req.emit(
            RequestUpdate(req.rid, delta, tokens, finished=True, result=result, error=error, handle=handle)
        )


def stream_meta_info(req: Request, num_tokens: int, logprobs_sent: int) -> dict[str, Any]:
    """SGLang's meta_info of a streamed chunk once `num_tokens` output tokens have been streamed:
    counts so far and, for a request that returns logprobs, the output logprobs of the tokens after
    the first `logprobs_sent` (incremental, as SGLang streams them) with their running total.
    Called off the output thread: its logprob lists only grow, and a token's entry is appended
    before the update that carries the token is emitted."""
    meta: dict[str, Any] = {"id": req.rid, "finish_reason": None, "prompt_tokens": req.prompt_len,
                            "completion_tokens": num_tokens, "cached_tokens": req.cached_tokens}  # fmt: skip
    if req.logprobs is not None:
        meta["output_token_logprobs"] = req.logprobs.output_token_logprobs[logprobs_sent:num_tokens]
        meta["output_top_logprobs"] = req.logprobs.output_top_logprobs[logprobs_sent:num_tokens]
        meta["output_token_logprobs_length"] = num_tokens
    return meta


def _unreleased_tokens(req: Request) -> list[int]:
    ids = req.detokenizer.ids
    tokens = ids[req.released_tokens :]
    req.released_tokens = len(ids)
    return tokens


def _result(req: Request, text: str) -> GenerateResult:
    assert req.finish_reason is not None
    ids = list(req.detokenizer.ids)
    return GenerateResult(
        rid=req.rid, text=text, output_ids=ids, prompt_tokens=req.prompt_len,
        completion_tokens=len(ids), cached_tokens=req.cached_tokens, finish_reason=req.finish_reason,
        e2e_latency=time.monotonic() - req.arrival, logprobs=req.logprobs,
    )  # fmt: skip
