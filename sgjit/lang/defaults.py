"""`RunDefaults`: the sampling values a run gives every gen() that leaves them unset — the keywords
of SGLang's `run()` / `run_batch()`, with SGLang's defaults. Which keywords those are, and their
defaults and checks, come from `SamplingParams` (its fields marked `run`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sgjit.compiler.nodes import Gen
from sgjit.errors import InvalidRequestError, ProgramError
from sgjit.runtime.sampling_params import RUN_KEYS, SamplingParams

LOGPROB_KEYS = ("return_logprob", "top_logprobs_num")


@dataclass(frozen=True, slots=True)
class RunDefaults:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return (*RUN_KEYS, *LOGPROB_KEYS)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunDefaults:
        """Defaults from run keywords (or their wire form); raises `ProgramError` naming a bad one."""
        sampling = {k: v for k, v in values.items() if k in RUN_KEYS}
        try:
            params = SamplingParams.from_dict(sampling)
        except InvalidRequestError as e:
            raise ProgramError(f"run default {e.param}={values.get(e.param or '')!r} is invalid: {e}") from e
        return_logprob = values.get("return_logprob", False)
        top = values.get("top_logprobs_num", 0)
        if not isinstance(return_logprob, bool):
            raise ProgramError(f"run default return_logprob must be True or False, got {return_logprob!r}")
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ProgramError(f"run default top_logprobs_num must be an integer >= 0, got {top!r}")
        return cls(params, return_logprob, top)

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[RunDefaults, dict[str, Any]]:
        """Separate run keywords (sampling defaults) from the program's own arguments."""
        names = set(cls.names())
        mine = {k: v for k, v in kwargs.items() if k in names}
        return cls.from_dict(mine), {k: v for k, v in kwargs.items() if k not in names}

    def to_dict(self) -> dict[str, Any]:
        """The wire form (what `from_dict` reads back)."""
        sampling = self.sampling.to_dict()
        return {**{k: v for k, v in sampling.items() if k in RUN_KEYS}, "return_logprob": self.return_logprob,
                "top_logprobs_num": self.top_logprobs_num}  # fmt: skip

    def request_for(self, node: Gen) -> tuple[SamplingParams, bool, int]:
        """(sampling params, return_logprob, top_logprobs_num) of one gen under these defaults."""
        params = replace(self.sampling, **node.sampling_overrides()) if node.sampling else self.sampling
        return_logprob = self.return_logprob if node.return_logprob is None else node.return_logprob
        top = self.top_logprobs_num if node.top_logprobs_num is None else node.top_logprobs_num
        return params, return_logprob, top
