"""The seam between prompt programs and whatever runs the model. The executor talks only to these two
protocols: `Backend` (tokenizer and chat template, sequences, the function registry, plan
invalidation) and `ProgramSequence` (one running program's sequence in the engine). `RuntimeBackend`
implements them in-process over `sgjit.Runtime`; an HTTP client (`RuntimeEndpoint`) and compiled-plan
execution (the JIT) implement the same ones.

Token ids cross the seam, not text: the executor decides the exact tokens a step feeds the model
(the tokenization of the program's whole text so far), so every backend runs the same tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sgjit.compiler.plan import GraphPlan
    from sgjit.lang.function import Function
    from sgjit.runtime.result import LogprobEntry
from sgjit.runtime.sampling_params import SamplingParams

# called with each new piece of a gen's text and SGLang's meta info of the chunk
OnText = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class GenStep:
    """One gen's request: the prompt tokens, the sampling parameters, the logprobs to return."""

    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False

    def logprob_options(self) -> dict[str, Any]:
        return {"return_logprob": self.return_logprob, "top_logprobs_num": self.top_logprobs_num,
                "logprob_start_len": self.logprob_start_len, "return_text_in_logprobs": self.return_text_in_logprobs}  # fmt: skip


@dataclass(slots=True)
class GenOutput:
    text: str  # the generated text, stop string trimmed
    meta_info: dict[str, Any]  # SGLang's meta_info: finish_reason, token counts, logprobs if asked


class ProgramSequence(Protocol):
    """One program's sequence: each step's prompt is the program's whole token sequence so far, and
    the part already computed stays resident between steps, so a step pays only for its new tokens."""

    def prefill(self, input_ids: list[int]) -> None:
        """Compute `input_ids` and keep them resident (before a fork or a select's choices)."""

    def generate(self, step: GenStep, on_text: OnText | None = None) -> GenOutput:
        """Run `step`; `on_text` gets each new piece of text, with the chunk's meta info, as it is
        produced."""

    def score(self, prompts: list[list[int]], starts: list[int]) -> list[list[LogprobEntry]]:
        """(logprob, token id, None) of every token of `prompts[i][starts[i]:]` given what precedes
        it, all prompts in one batched forward (they share the resident prefix). Each start is >= 1."""

    def fork(self) -> ProgramSequence:
        """A sequence continuing from this one's resident prefix, sharing its KV pages."""

    def close(self) -> None:
        """Let go of everything resident; the sequence is not used again."""


@runtime_checkable
class Backend(Protocol):
    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str: ...

    def unconditional_prefix(self) -> list[int]:
        """The context for `unconditional_likelihood_normalized`: a document start, nothing else."""

    def open_sequence(self, protected: bool = False) -> ProgramSequence:
        """A new program sequence; `protected` for a compiled plan's run (never preempted for others)."""

    def register_function(self, function: Function) -> None:
        """Remember a program function run here, so `reload_function(name)` can find it."""

    def lookup_function(self, name: str) -> Function | None: ...

    def invalidate_plan(self, plan_hash: str) -> None:
        """Drop every artefact cached for the plan `plan_hash` (its source changed)."""

    def compile(self, plan: GraphPlan) -> Any:
        """The backend's compiled form of `plan` (a JIT), or None to run the plan uncompiled."""

    def clear_jit_cache(self) -> int:
        """Drop every compiled plan; returns how many."""

    def flush_cache(self) -> int:
        """Drop every prefix-cache entry no running request uses; returns the pages freed."""

    def get_server_info(self) -> dict[str, Any]:
        """The model, settings and counters of what runs the programs."""
