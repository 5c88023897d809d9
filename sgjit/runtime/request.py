"""`Request`: one sequence inside the engine, from submission to finish, and the updates it sends
back to whoever submitted it. The engine thread owns the token list and the KV bookkeeping; the
output thread owns the text (detokenizer, stream position, logprob entries)."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sgjit.runtime.result import FinishReason, Logprobs, RequestUpdate
from sgjit.runtime.sampling_params import SamplingParams
from sgjit.runtime.tokenizer import IncrementalDetokenizer

_ids = itertools.count()


def new_request_id() -> str:
    return f"req-{next(_ids)}"


class Status(enum.Enum):
    """Where a request is: queued, holding pages in the running batch, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class PrefixHandle:
    """Pages of a finished sequence kept resident for its program's next step; release it through
    the engine when the program moves on or ends."""

    token_ids: list[int]
    pages: list[int]


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    sink: Callable[[RequestUpdate], None] | None = None
    hold_prefix: bool = False  # hand the finished sequence's pages back as a PrefixHandle
    release_on_admit: PrefixHandle | None = None
    protected: bool = (
        False  # a compiled program's step: admitted with room for its worst case, never preempted for others
    )
    grammar: Any = None  # a GrammarMatcher when the request is constrained
    # --- engine state ---
    # prompt + output; ids of a launch still in flight are negative placeholders (see futures.py)
    tokens: list[int] = field(default_factory=list)
    # KV pages: only appended to while the request holds them (a release replaces the list), which
    # lets the decode graphs' page tables keep a row's pages between launches (cuda_graph.py)
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in `pages`
    cached_tokens: int = 0  # prompt tokens that came from the prefix cache
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    # tokens that end the sequence: stop_token_ids, and EOS unless ignore_eos (set on submission)
    stop_ids: frozenset[int] = frozenset()
    arrival: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    preemptions: int = 0
    next_input_logprob: int = 0  # next prompt position whose input logprob is still to record
    # --- output-thread state (the engine reads `text_stop` only after a barrier) ---
    stop_trim: int = 0  # characters of matched stop string to cut from the text
    released_chars: int = 0  # text sent to the sink so far
    released_tokens: int = 0  # output tokens sent to the sink so far
    text_stop: tuple[int, FinishReason] | None = None  # (index in `tokens`, reason) of a stop string/regex
    logprobs: Logprobs | None = None  # what is recorded of them, when return_logprob

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_ids)
        if self.return_logprob:
            self.logprobs = Logprobs()
        self.prompt_len = len(self.prompt_ids)
        wants_input = self.return_logprob and self.logprob_start_len >= 0
        self.next_input_logprob = (
            min(self.logprob_start_len, self.prompt_len) if wants_input else self.prompt_len
        )

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens whose K/V are still to compute before the next sample."""
        return len(self.tokens) - self.num_computed

    @property
    def wants_tokens(self) -> bool:
        return self.num_output < self.params.max_new_tokens

    @property
    def has_text_stops(self) -> bool:
        """Stop strings or regexes: only the output thread, which decodes text, can see them."""
        return bool(self.params.stop or self.params.stop_regex)

    def max_prefix_match(self) -> int:
        """How many leading tokens may come from the prefix cache: at least one token must run, and
        prompt positions whose input logprobs are still owed must be computed."""
        limit = len(self.tokens) - 1
        if self.next_input_logprob < self.prompt_len:
            limit = min(limit, max(0, self.next_input_logprob - 1))
        return limit

    def emit(self, update: RequestUpdate) -> None:
        if self.sink is not None:
            self.sink(update)
