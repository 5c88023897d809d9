"""`RunDefaults`: the sampling values a run gives every gen() that leaves them unset — the keywords
of SGLang's `run()` / `run_batch()`, with SGLang's defaults. Which keywords those are, and their
defaults and checks, come from `SamplingParams` (its fields marked `run`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sgjit.compiler.nodes import Gen
from sgjit.errors import InvalidRequestError, ProgramError
from sgjit.lang.backend import GenStep
from sgjit.runtime.sampling_params import RUN_KEYS, SamplingParams

LOGPROB_KEYS = ("return_logprob", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs")
# run() keywords SGLang takes that change nothing here: every program already runs its steps on a
# worker thread of its own (use_thread), and n > 1 is refused (a program draws one sample a gen).
ACCEPTED_KEYS = ("use_thread", "n")


@dataclass(frozen=True, slots=True)
class RunDefaults:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return (*RUN_KEYS, *LOGPROB_KEYS, *ACCEPTED_KEYS)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunDefaults:
        """Defaults from run keywords (or their wire form); raises `ProgramError` naming a bad one."""
        sampling = {k: v for k, v in values.items() if k in RUN_KEYS}
        try:
            params = SamplingParams.from_dict(sampling)
        except InvalidRequestError as e:
            raise ProgramError(f"run default {e.param}={values.get(e.param or '')!r} is invalid: {e}") from e
        if values.get("n") not in (None, 1):
            raise ProgramError(
                f"run(n={values['n']!r}): a program runs once a call; use run_batch or s.fork(n)"
            )
        given = {k: values[k] for k in LOGPROB_KEYS if values.get(k) is not None}
        try:
            out = cls(params, **given)
        except TypeError as e:
            raise ProgramError(f"invalid run defaults: {e}") from e
        if not isinstance(out.return_logprob, bool) or not isinstance(out.return_text_in_logprobs, bool):
            raise ProgramError(
                "run defaults return_logprob and return_text_in_logprobs must be True or False"
            )
        for f, low in (("top_logprobs_num", 0), ("logprob_start_len", -1)):
            v = getattr(out, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ProgramError(f"run default {f} must be an integer >= {low}, got {v!r}")
        return out

    @classmethod
    def split(
        cls, kwargs: dict[str, Any], params: frozenset[str] = frozenset()
    ) -> tuple[RunDefaults, dict[str, Any]]:
        """Separate run keywords (sampling defaults) from the program's own arguments. A program
        parameter named like one of SGLang's accepted-and-ignored keywords (`n`, `use_thread`) keeps
        its argument."""
        names = set(cls.names()) - (params & set(ACCEPTED_KEYS))
        mine = {k: v for k, v in kwargs.items() if k in names}
        return cls.from_dict(mine), {k: v for k, v in kwargs.items() if k not in names}

    def to_dict(self) -> dict[str, Any]:
        """The wire form (what `from_dict` reads back)."""
        sampling = self.sampling.to_dict()
        return {
            **{k: v for k, v in sampling.items() if k in RUN_KEYS},
            **{k: getattr(self, k) for k in LOGPROB_KEYS},
        }

    def step_for(self, node: Gen, input_ids: list[int]) -> GenStep:
        """The request of one gen under these defaults, after `input_ids`."""
        params = replace(self.sampling, **node.sampling_overrides()) if node.sampling else self.sampling
        logprobs = {
            k: getattr(self, k) if getattr(node, k) is None else getattr(node, k) for k in LOGPROB_KEYS
        }
        return GenStep(input_ids, params, **logprobs)
