"""`SamplingParams`: SGLang's `sampling_params` keys, validated once at the door so nothing invalid
reaches the engine thread. Each field also says where else it appears — as a `gen()` keyword, a
default of `run()`, a field of the OpenAI requests — and every other form is derived from that:
the DSL's `Gen` node and `RunDefaults`, the OpenAI request model and its mapping. A new knob is a
field here, its use in the sampler, and (to be a `gen()` parameter) a keyword of `gen()`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from sgjit.errors import ConflictingParamsError, GrammarError, InvalidRequestError
from sgjit.runtime.text_input import check_text

Convert = Callable[[str, Any], Any]

# SGLang's sampling_params.n, read by Runtime.make_requests: samples of one prompt. The hard ceiling
# of the library; a server may set a lower one (sgjit serve --max-n).
MAX_SAMPLES_PER_PROMPT = 128


@dataclass(frozen=True, slots=True)
class Range:
    """The values a numeric knob may take: checked by `validate` and stated in the OpenAI schema."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself excluded

    def holds(self, v: float) -> bool:
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        return above and (self.hi is None or v <= self.hi)

    def text(self) -> str:
        if self.hi is None:
            return f"must be {'>' if self.lo_open else '>='} {self.lo:g}"
        return f"must be in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"

    def schema_bounds(self) -> dict[str, float]:
        """pydantic `Field` keywords (ge / gt / le) for the same range."""
        out: dict[str, float] = {}
        if self.lo is not None:
            out["gt" if self.lo_open else "ge"] = self.lo
        if self.hi is not None:
            out["le"] = self.hi
        return out


@dataclass(frozen=True, slots=True)
class Knob:
    """How one sampling parameter is read and where it is offered besides `sampling_params`."""

    convert: Convert  # (key, raw value) -> normalised value; raises InvalidRequestError
    accepts: Any  # the JSON type a request may give (for the OpenAI request model)
    gen: str | None = None  # its gen() keyword; None: not a gen parameter
    run: bool = False  # also a keyword of Function.run()/run_batch(): the default of every gen
    openai: str | None = None  # its field in OpenAI requests; None: not offered there
    range: Range | None = None  # numeric knobs: the values allowed


def _int(key: str, v: Any) -> int:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not (math.isfinite(v) and v.is_integer()))
    ):
        raise InvalidRequestError(f"sampling parameter {key!r} must be an integer, got {v!r}", key)
    return int(v)


def samples_per_prompt(params: dict[str, Any] | SamplingParams | None) -> int:
    """SGLang's `sampling_params.n`: how many samples of the prompt to draw (1 unless given; a whole
    number in JSON, 3.0 included, like every integer knob)."""
    n = params.get("n", 1) if isinstance(params, dict) else 1
    n = 1 if n is None else _int("n", n)
    if not 1 <= n <= MAX_SAMPLES_PER_PROMPT:
        raise InvalidRequestError(
            f"sampling parameter 'n' must be an integer in [1, {MAX_SAMPLES_PER_PROMPT}]", "n"
        )
    return n


def _float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a finite number, got {v!r}", key)
    try:
        out = float(v)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a finite number, got {v!r}", key)
    return out


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidRequestError(f"sampling parameter {key!r} must be true or false, got {v!r}", key)
    return v


def _str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a string, got {type(v).__name__}", key)
    return check_text(v, f"sampling parameter {key!r}", key)


def _str_list(key: str, v: Any) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a string or a list of strings", key)
    return [check_text(s, f"sampling parameter {key!r}", key) for s in v]


def _int_list(key: str, v: Any) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if not isinstance(v, (list, tuple)):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a list of token ids", key)
    return [_int(key, x) for x in v]


def _schema(key: str, v: Any) -> str:
    if isinstance(v, dict):
        _check_strings(v, key)
        return json.dumps(v)
    text = _str(key, v)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"json_schema is not valid JSON: {e}; send a JSON Schema (an object)", key) from e
    return text


def _check_strings(value: Any, key: str) -> None:
    """Every key and string in a parsed JSON value (json.dumps would hide a NUL as \\u0000)."""
    if isinstance(value, str):
        check_text(value, key, key)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_strings(k, key)
            _check_strings(v, key)
    elif isinstance(value, list):
        for v in value:
            _check_strings(v, key)


TOKEN_ID_KEY = re.compile(r"\s*-?[0-9]+\s*")  # a logit_bias key: a decimal token id (ASCII digits)


def _logit_bias(key: str, v: Any) -> dict[int, float]:
    """OpenAI's / SGLang's `{"token id": bias}` (keys may be ints or their decimal strings)."""
    if not isinstance(v, dict):
        raise InvalidRequestError(f"sampling parameter {key!r} must be an object of token id -> bias", key)
    out = {}
    for tok, bias in v.items():
        if isinstance(tok, str) and TOKEN_ID_KEY.fullmatch(tok):
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {tok!r}", key)
        out[tok] = _float(key, bias)
    return out


def _accepted(key: str, v: Any) -> Any:
    """A parameter SGLang's frontend sends that changes nothing here (documented with its field)."""
    return v


def _top_k(key: str, v: Any) -> int:
    k = _int(key, v)
    return -1 if k == 0 else k


def knob(default: Any, convert: Convert, accepts: Any, **where: Any) -> Any:
    """A `SamplingParams` field with its `Knob`."""
    meta = {"knob": Knob(convert, accepts, **where)}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = knob(128, _int, int, gen="max_tokens", run=True, range=Range(0))
    min_new_tokens: int = knob(0, _int, int, gen="min_tokens", openai="min_tokens", range=Range(0))
    temperature: float = knob(
        1.0, _float, float, gen="temperature", run=True, openai="temperature", range=Range(0.0)
    )
    top_p: float = knob(
        1.0, _float, float, gen="top_p", run=True, openai="top_p", range=Range(0.0, 1.0, True)
    )
    top_k: int = knob(
        -1, _top_k, int, gen="top_k", run=True, openai="top_k", range=Range(-1, 2**31 - 1)
    )  # 0, -1: off
    min_p: float = knob(0.0, _float, float, gen="min_p", run=True, openai="min_p", range=Range(0.0, 1.0))
    frequency_penalty: float = knob(
        0.0,
        _float,
        float,
        gen="frequency_penalty",
        run=True,
        openai="frequency_penalty",
        range=Range(-2.0, 2.0),
    )
    presence_penalty: float = knob(
        0.0,
        _float,
        float,
        gen="presence_penalty",
        run=True,
        openai="presence_penalty",
        range=Range(-2.0, 2.0),
    )
    repetition_penalty: float = knob(
        1.0, _float, float, openai="repetition_penalty", range=Range(0.0, 2.0, True)
    )
    stop: list[str] = knob([], _str_list, str | list[str], gen="stop", run=True, openai="stop")
    stop_regex: list[str] = knob(
        [], _str_list, str | list[str], gen="stop_regex", run=True, openai="stop_regex"
    )
    stop_token_ids: list[int] = knob(
        [], _int_list, list[int], gen="stop_token_ids", run=True, openai="stop_token_ids"
    )
    ignore_eos: bool = knob(False, _bool, bool, gen="ignore_eos", run=True, openai="ignore_eos")
    skip_special_tokens: bool = knob(True, _bool, bool, openai="skip_special_tokens")
    no_stop_trim: bool = knob(False, _bool, bool)
    seed: int | None = knob(None, _int, int, openai="seed", range=Range(0, 2**63 - 1))
    sampling_seed: int | None = knob(None, _int, int)  # SGLang's name for seed (folded into it)
    logit_bias: dict[int, float] | None = knob(None, _logit_bias, dict[str, float], openai="logit_bias")
    # Accepted so SGLang's frontend and clients work unchanged; they change nothing here:
    # fast tokenizers never put spaces between special tokens, every token is streamed as it comes,
    # and no custom logit processor is installed to read custom_params.
    spaces_between_special_tokens: bool = knob(True, _bool, bool)
    stream_interval: int | None = knob(None, _int, int)
    custom_params: dict[str, Any] | None = knob(None, _accepted, dict[str, Any])
    regex: str | None = knob(None, _str, str, gen="regex", openai="regex")
    json_schema: str | None = knob(
        None, _schema, str | dict[str, Any], gen="json_schema", openai="json_schema"
    )
    choices: list[str] | None = knob(None, _str_list, list[str])
    ebnf: str | None = knob(None, _str, str, openai="ebnf")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def finishing_ids(self, eos_token_ids: tuple[int, ...]) -> frozenset[int]:
        """Token ids that end a sequence: the stop tokens, and EOS unless ignore_eos."""
        return frozenset(self.stop_token_ids) | frozenset(() if self.ignore_eos else eos_token_ids)

    @property
    def grammar_key(self) -> tuple[str, str] | None:
        if self.regex is not None:
            return ("regex", self.regex)
        if self.json_schema is not None:
            return ("json_schema", self.json_schema)
        if self.choices is not None:
            return ("choices", json.dumps(self.choices))
        if self.ebnf is not None:
            return ("ebnf", self.ebnf)
        return None

    @classmethod
    def from_dict(cls, params: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        if isinstance(params, SamplingParams):
            return params
        if params is None:
            return cls()
        if not isinstance(params, dict):
            raise InvalidRequestError(
                f"sampling_params must be a dict, got {type(params).__name__}", "sampling_params"
            )
        unsupported = sorted(set(params) & UNSUPPORTED)
        if unsupported:
            raise InvalidRequestError(
                f"sampling parameter {unsupported[0]!r} is not supported by sgjit; leave it out",
                unsupported[0],
            )
        unknown = sorted(set(params) - set(KNOBS) - {"n"})
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s) {unknown}; known: {sorted(KNOBS)}", unknown[0]
            )
        sp = cls()
        for key, value in params.items():
            if key == "n" or value is None:
                continue
            setattr(sp, key, KNOBS[key].convert(key, value))
        if sp.sampling_seed is not None:
            _check(sp.seed in (None, sp.sampling_seed), "sampling_seed", "and seed disagree; give one")
            sp.seed, sp.sampling_seed = sp.sampling_seed, None
        sp.validate()
        return sp

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a request must send to mean this)."""
        default = SamplingParams()
        return {k: getattr(self, k) for k in KNOBS if getattr(self, k) != getattr(default, k)}

    def validate(self) -> None:
        for name, k in KNOBS.items():
            value = getattr(self, name)
            if k.range is not None and value is not None:
                _check(k.range.holds(value), name, k.range.text())
        _check(all(s for s in self.stop), "stop", "stop strings must be non-empty")
        bad = next((r for r in self.stop_regex if not _compiles(r)), None)
        if bad is not None:  # a grammar problem (the content of the field), not a range
            raise GrammarError(
                f"sampling parameter 'stop_regex' {bad!r} is not a valid regular expression that cannot "
                "match the empty string",
                "stop_regex",
            )
        _check(
            self.logit_bias is None or all(-100.0 <= b <= 100.0 for b in self.logit_bias.values()),
            "logit_bias",
            "biases must be in [-100, 100]",
        )
        constraints = [k for k in ("regex", "json_schema", "choices", "ebnf") if getattr(self, k) is not None]
        if len(constraints) > 1:  # each valid alone: a conflict, not a bad value
            raise ConflictingParamsError(
                f"sampling parameters {constraints} each constrain the output: set only one of them",
                constraints[-1],
            )
        _check(self.choices is None or len(self.choices) > 0, "choices", "must list at least one choice")


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return re.compile(pattern).search("") is None  # a pattern that matches nothing would stop at once


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"sampling parameter {param!r} {message}", param)


KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in fields(SamplingParams)}
GEN_KEYS: dict[str, str] = {k.gen: name for name, k in KNOBS.items() if k.gen}  # gen() keyword -> field
RUN_KEYS: tuple[str, ...] = tuple(name for name, k in KNOBS.items() if k.run)
OPENAI_KEYS: dict[str, str] = {
    k.openai: name for name, k in KNOBS.items() if k.openai
}  # OpenAI field -> field
# What SGLang accepts and sgjit cannot honour: a clear error, never silently dropped.
UNSUPPORTED = frozenset({"structural_tag", "ebnf_grammar_path", "lora_path"})
