"""`first_finish`: what a token id alone says about a sequence's end, decided on the engine thread when
a launch is read back (stop strings, which need the text, are the output thread's: output.py)."""

from __future__ import annotations

from sgjit.runtime.request import Request
from sgjit.runtime.result import FinishReason


def first_finish(
    req: Request, base: int, got: list[int], max_model_len: int
) -> tuple[int | None, FinishReason | None]:
    """The first of the tokens `got` (at index `base` of `req.tokens`) that ends the request by its
    id, and why — checked in the order a single token always was: a stop token or EOS
    (`req.stop_ids`), the grammar's end, max_new_tokens, the context. Advances the grammar over the
    tokens up to there."""
    at_max_new = max(0, req.prompt_len + req.params.max_new_tokens - base - 1)
    at_context = max(0, max_model_len - base - 1)
    if req.grammar is None and min(at_max_new, at_context) >= len(got) and req.stop_ids.isdisjoint(got):
        return None, None  # the common case, decided without building the list below
    found: list[tuple[int, int, FinishReason]] = []  # (index, rank of the check, reason)
    if not req.stop_ids.isdisjoint(got):
        k = next(k for k, tok in enumerate(got) if tok in req.stop_ids)
        found.append((k, 0, FinishReason.stop(got[k])))
    if req.grammar is not None:
        for k, tok in enumerate(got[: found[0][0] + 1] if found else got):
            req.grammar.accept(tok)
            if req.grammar.is_finished():
                found.append((k, 1, FinishReason.stop(None)))
                break
    if at_max_new < len(got):
        found.append((at_max_new, 2, FinishReason.at_length(req.params.max_new_tokens)))
    if at_context < len(got):
        found.append((at_context, 3, FinishReason.at_length(base + at_context + 1 - req.prompt_len)))
    if not found:
        return None, None
    k, _, reason = min(found, key=lambda f: (f[0], f[1]))
    return k, reason
