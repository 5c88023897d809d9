"""`RunDefaults`: the sampling values a run gives every gen() that leaves them None — the keywords of
SGLang's `run()` / `run_batch()`, with SGLang's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sgjit.compiler.nodes import Gen
from sgjit.errors import InvalidRequestError, ProgramError
from sgjit.runtime.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RunDefaults:
    max_new_tokens: int = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0

    def __post_init__(self) -> None:
        try:
            SamplingParams.from_dict(self._sampling())
        except InvalidRequestError as e:
            raise ProgramError(
                f"run default {e.param}={getattr(self, e.param or '', None)!r} is invalid: {e}"
            ) from e

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[RunDefaults, dict[str, Any]]:
        """Separate run keywords (sampling defaults) from the program's own arguments."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names}), {
            k: v for k, v in kwargs.items() if k not in names
        }

    def _sampling(self) -> dict[str, Any]:
        out = asdict(self)
        del out["return_logprob"], out["top_logprobs_num"]
        return out

    def request_for(self, node: Gen) -> tuple[dict[str, Any], bool, int]:
        """(sampling params, return_logprob, top_logprobs_num) of one gen under these defaults."""
        params = {**self._sampling(), **node.sampling_overrides()}
        return_logprob = self.return_logprob if node.return_logprob is None else node.return_logprob
        top = self.top_logprobs_num if node.top_logprobs_num is None else node.top_logprobs_num
        return params, return_logprob, top
