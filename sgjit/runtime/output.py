"""`OutputProcessor`: what the engine does with a token once it is sampled — the grammar advances,
the text grows, stop tokens, stop strings and stop regexes end the sequence, logprobs are recorded, and text is
handed to the submitter as it becomes final (the last `len(longest stop) - 1` characters are held
back, since a stop string may still begin there). On finish it builds the `GenerateResult`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import torch

from sgjit.runtime.request import PrefixHandle, Request
from sgjit.runtime.result import FinishReason, GenerateResult, LogprobEntry, RequestUpdate
from sgjit.runtime.tokenizer import Tokenizer


def logprob_entries(
    logprobs: torch.Tensor, token_ids: list[int], top_n: int, text: Callable[[int], str] | None
) -> tuple[list[LogprobEntry], list[list[LogprobEntry]] | None]:
    """(logprob, id, text) of each chosen token and, when asked, of the `top_n` best at each row."""
    ids = torch.tensor(token_ids, dtype=torch.int64, device=logprobs.device)
    chosen = logprobs.gather(1, ids[:, None])[:, 0].tolist()
    entries = [(lp, t, text(t) if text else None) for lp, t in zip(chosen, token_ids)]
    if top_n <= 0:
        return entries, None
    vals, idx = logprobs.topk(top_n, dim=-1)
    tops = [
        [(v, i, text(i) if text else None) for v, i in zip(vrow, irow)]
        for vrow, irow in zip(vals.tolist(), idx.tolist())
    ]
    return entries, tops


# Characters held back from the stream while a stop regex could still match (a match longer than
# this that began in text already streamed is not seen: streamed text is never taken back).
STOP_REGEX_HOLD_CHARS = 64


class OutputProcessor:
    def __init__(
        self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...], max_model_len: int, vocab_size: int
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    # ----- logprobs -----
    def _text_fn(self, req: Request) -> Callable[[int], str] | None:
        return (lambda t: self.tokenizer.decode([t])) if req.return_text_in_logprobs else None

    def record_input_logprobs(self, req: Request, logits: torch.Tensor, first_pos: int) -> None:
        """Logprobs of the prompt tokens after positions `first_pos ...` (the logits of those rows)."""
        lp = req.logprobs
        assert lp is not None, "only requests that return logprobs have prompt rows to record"
        text = self._text_fn(req)
        if req.next_input_logprob == 0 and not lp.input_token_logprobs:
            first = req.tokens[0]
            lp.input_token_logprobs.append((None, first, text(first) if text else None))
            lp.input_top_logprobs.append(None)
        targets = req.tokens[first_pos + 1 : first_pos + 1 + logits.shape[0]]
        lps = torch.log_softmax(logits[:, : self.vocab_size], dim=-1)
        entries, tops = logprob_entries(lps, targets, req.top_logprobs_num, text)
        lp.input_token_logprobs.extend(entries)
        lp.input_top_logprobs.extend(tops if tops is not None else [None] * len(entries))
        req.next_input_logprob = first_pos + 1 + len(targets)

    def record_output_logprobs(self, reqs: list[Request], logits: torch.Tensor, tokens: list[int]) -> None:
        """Logprobs of this step's sampled tokens, for the rows that asked (`logits` after the
        sampler's processing, one row a request)."""
        want = [i for i, r in enumerate(reqs) if r.logprobs is not None]
        if not want:
            return
        lps = torch.log_softmax(logits[want], dim=-1)
        for j, i in enumerate(want):
            req = reqs[i]
            entries, tops = logprob_entries(
                lps[j : j + 1], [tokens[i]], req.top_logprobs_num, self._text_fn(req)
            )
            req.logprobs.output_token_logprobs.extend(entries)  # type: ignore[union-attr]
            if tops is not None:
                req.logprobs.output_top_logprobs.extend(tops)  # type: ignore[union-attr]

    # ----- tokens -----
    def accept(self, req: Request, tok: int) -> FinishReason | None:
        """Append a sampled token; the reason the sequence ends with it, or None."""
        p = req.params
        req.tokens.append(tok)
        if req.grammar is not None:
            req.grammar.accept(tok)
        old_len = len(req.detokenizer.text)
        req.detokenizer.push([tok])
        if tok in p.stop_token_ids or (tok in self.eos_token_ids and not p.ignore_eos):
            return FinishReason.stop(tok)
        if p.stop:
            text = req.detokenizer.text
            longest = max(len(s) for s in p.stop)
            window_start = max(0, old_len - longest + 1)
            hits = [(i, s) for s in p.stop if (i := text.find(s, window_start)) >= 0]
            if hits:
                i, s = min(hits)
                req.stop_trim = len(text) - (i + len(s) if p.no_stop_trim else i)
                return FinishReason.stop(s)
        for pattern in p.stop_regex:  # a match must start in text not yet streamed (streamed text is final)
            if (m := re.compile(pattern).search(req.detokenizer.text, req.released_chars)) is not None:
                req.stop_trim = len(req.detokenizer.text) - (m.end() if p.no_stop_trim else m.start())
                return FinishReason.stop(m.group(0))
        if req.grammar is not None and req.grammar.is_finished():
            return FinishReason.stop(None)
        if not req.wants_tokens:
            return FinishReason.at_length(p.max_new_tokens)
        if len(req.tokens) >= self.max_model_len:
            return FinishReason.at_length(req.num_output)
        return None

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
        """The final update: the rest of the text, and the result (or the error)."""
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
    Called off the engine thread: the engine's logprob lists only grow, and a token's entry is
    appended before the update that carries the token is emitted."""
    meta: dict[str, Any] = {"id": req.rid, "finish_reason": None, "prompt_tokens": req.prompt_len,
                            "completion_tokens": num_tokens, "cached_tokens": req.cached_tokens}  # fmt: skip
    if req.logprobs is not None:
        meta["output_token_logprobs"] = req.logprobs.output_token_logprobs[logprobs_sent:num_tokens]
        meta["output_top_logprobs"] = req.logprobs.output_top_logprobs[logprobs_sent:num_tokens]
        meta["output_token_logprobs_length"] = num_tokens
    return meta


def _unreleased_tokens(req: Request) -> list[int]:
    tokens = req.output_ids[req.released_tokens :]
    req.released_tokens = req.num_output
    return tokens


def _result(req: Request, text: str) -> GenerateResult:
    assert req.finish_reason is not None
    return GenerateResult(
        rid=req.rid, text=text, output_ids=req.output_ids, prompt_tokens=req.prompt_len,
        completion_tokens=req.num_output, cached_tokens=req.cached_tokens, finish_reason=req.finish_reason,
        e2e_latency=time.monotonic() - req.arrival, logprobs=req.logprobs,
    )  # fmt: skip
