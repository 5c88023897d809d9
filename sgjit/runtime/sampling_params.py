"""`SamplingParams`: SGLang's `sampling_params` keys, validated once at the door so nothing invalid
reaches the engine thread."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from sgjit.errors import InvalidRequestError


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None  # JSON text of the schema
    choices: list[str] | None = None
    ebnf: str | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

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
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known - {"n"})
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}", unknown[0]
            )
        sp = cls()
        for key, value in params.items():
            if key == "n" or value is None:
                continue
            setattr(sp, key, _CONVERT[key](key, value))
        sp.validate()
        return sp

    def validate(self) -> None:
        _check(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
        _check(self.min_new_tokens >= 0, "min_new_tokens", "must be >= 0")
        _check(self.temperature >= 0.0, "temperature", "must be >= 0")
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(self.top_k == -1 or 1 <= self.top_k < 2**31, "top_k", "must be -1 (off) or in [1, 2**31)")
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(0.0 < self.repetition_penalty <= 2.0, "repetition_penalty", "must be in (0, 2]")
        _check(all(s for s in self.stop), "stop", "stop strings must be non-empty")
        _check(self.seed is None or 0 <= self.seed < 2**63, "seed", "must be in [0, 2**63)")
        constraints = [k for k in ("regex", "json_schema", "choices", "ebnf") if getattr(self, k) is not None]
        _check(
            len(constraints) <= 1,
            constraints[-1] if constraints else "regex",
            f"only one of {constraints} may be set",
        )
        _check(self.choices is None or len(self.choices) > 0, "choices", "must list at least one choice")


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"sampling parameter {param!r} {message}", param)


def _int(key: str, v: Any) -> int:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and not v.is_integer())
    ):
        raise InvalidRequestError(f"sampling parameter {key!r} must be an integer, got {v!r}", key)
    return int(v)


def _float(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a finite number, got {v!r}", key)
    return float(v)


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidRequestError(f"sampling parameter {key!r} must be true or false, got {v!r}", key)
    return v


def _str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a string, got {type(v).__name__}", key)
    return v


def _str_list(key: str, v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a string or a list of strings", key)
    return list(v)


def _int_list(key: str, v: Any) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if not isinstance(v, (list, tuple)):
        raise InvalidRequestError(f"sampling parameter {key!r} must be a list of token ids", key)
    return [_int(key, x) for x in v]


def _schema(key: str, v: Any) -> str:
    if isinstance(v, dict):
        return json.dumps(v)
    text = _str(key, v)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"json_schema is not valid JSON: {e}", key) from e
    return text


def _top_k(key: str, v: Any) -> int:
    k = _int(key, v)
    return -1 if k == 0 else k


_CONVERT = {
    "max_new_tokens": _int,
    "min_new_tokens": _int,
    "temperature": _float,
    "top_p": _float,
    "top_k": _top_k,
    "min_p": _float,
    "frequency_penalty": _float,
    "presence_penalty": _float,
    "repetition_penalty": _float,
    "stop": _str_list,
    "stop_token_ids": _int_list,
    "ignore_eos": _bool,
    "skip_special_tokens": _bool,
    "no_stop_trim": _bool,
    "seed": _int,
    "regex": _str,
    "json_schema": _schema,
    "choices": _str_list,
    "ebnf": _str,
}
