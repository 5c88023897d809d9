"""The per-request caps of `sgjit serve` (`ServerArgs.max_*`), one check for /generate and the
OpenAI routes alike. `SamplingParams` checks what any value must be (a stop string is non-empty);
these check how much of it one request may ask for on a shared server, and name the flag that
raises the cap. `n` is checked before any request is built, the rest on the built requests, where
every API's fields have become the same `SamplingParams`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sgjit.errors import InvalidRequestError
from sgjit.runtime.request import Request
from sgjit.server.args import ServerArgs


def _over(what: str, value: int, cap: int, flag: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{what} is {value}, above this server's limit of {cap}; ask for at most {cap} "
        f"(the server's operator can raise it with --{flag})",
        param,
    )


def check_n(args: ServerArgs, n: Any) -> None:
    """`n` samples per prompt (a non-integer is left to the request's own validation; 3.0 is 3)."""
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, int) and not isinstance(n, bool) and n > args.max_n:
        raise _over("n", n, args.max_n, "max-n", "n")


def check_generate_n(args: ServerArgs, sampling_params: Any) -> None:
    """/generate's `n` lives inside `sampling_params` (one dict, or one per prompt)."""
    items = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    for sp in items:
        if isinstance(sp, dict):
            check_n(args, sp.get("n"))


def check_requests(args: ServerArgs, reqs: Iterable[Request], top_logprobs_param: str) -> None:
    """The caps on what each built request asks for; `top_logprobs_param` is the API's name of it."""
    for req in reqs:
        p = req.params
        if req.top_logprobs_num > args.max_top_logprobs:
            raise _over(
                top_logprobs_param, req.top_logprobs_num, args.max_top_logprobs, "max-top-logprobs",
                top_logprobs_param,
            )  # fmt: skip
        for name, values in (("stop", p.stop), ("stop_regex", p.stop_regex)):
            if len(values) > args.max_stop_strings:
                raise _over(f"the number of {name} strings", len(values), args.max_stop_strings,
                            "max-stop-strings", name)  # fmt: skip
            longest = max(map(len, values), default=0)
            if longest > args.max_stop_length:
                raise _over(f"the longest {name} string's length", longest, args.max_stop_length,
                            "max-stop-length", name)  # fmt: skip
        if len(p.stop_token_ids) > args.max_stop_token_ids:
            raise _over("the number of stop_token_ids", len(p.stop_token_ids), args.max_stop_token_ids,
                        "max-stop-token-ids", "stop_token_ids")  # fmt: skip
