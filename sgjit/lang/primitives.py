"""The program primitives: `gen` (and its typed forms), `select`, and the chat roles. Each returns an
`Expr` of plan nodes; nothing runs until a state takes it."""

from __future__ import annotations

from typing import Any

from sgjit.compiler.nodes import Gen, RoleBegin, RoleEnd, Select
from sgjit.errors import ProgramError
from sgjit.lang.choices import ChoicesMethod, token_length_normalized
from sgjit.lang.expr import Expr, as_nodes, plain
from sgjit.lang.scope import require_program

# dtype= maps to these regexes (the value stays text in the state, as the model wrote it).
DTYPE_REGEX: dict[type, str] = {
    int: r"[-+]?[0-9]+",
    float: r"[-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?",
    bool: r"(True|False)",
    str: r'"([^"\\\n]|\\.)*"',
}


def _reject_unknown(primitive: str, unknown: dict[str, Any], known: list[str]) -> None:
    if unknown:
        raise ProgramError(
            f"{primitive}() got unknown keyword argument(s) {sorted(unknown)}; it takes {', '.join(known)}"
        )


_GEN_KEYWORDS = [
    "name", "max_tokens", "min_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob", "top_logprobs_num", "regex",
    "json_schema", "choices", "choices_method", "dtype",
]  # fmt: skip


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    top_logprobs_num: int | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesMethod | str | None = None,
    dtype: type | None = None,
    **unknown: Any,
) -> Expr:
    """Generate text into variable `name`. A parameter left None takes the run's default; `choices`
    makes it a `select`; `dtype` (int, float, bool, str) constrains it with a regex."""
    require_program("gen")
    _reject_unknown("gen", unknown, _GEN_KEYWORDS)
    params = {
        "max_tokens": max_tokens, "min_tokens": min_tokens, "stop": stop, "stop_token_ids": stop_token_ids,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
        "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos, "return_logprob": return_logprob, "top_logprobs_num": top_logprobs_num,
        "regex": regex, "json_schema": json_schema,
    }  # fmt: skip
    plain(name, "the gen name")
    for key, value in params.items():
        plain(value, f"gen({name!r}) parameter {key}")
    if choices is not None:
        extra = sorted(k for k, v in params.items() if v is not None and k != "temperature")
        if extra or dtype is not None:
            raise ProgramError(
                f"gen({name!r}, choices=...) is a select; it takes only name, choices, temperature and "
                f"choices_method, not {extra or ['dtype']}"
            )
        return select(name, choices, 0.0 if temperature is None else temperature, choices_method)
    if choices_method is not None:
        raise ProgramError(f"gen({name!r}): choices_method applies only with choices=[...]")
    if dtype is not None:
        if regex is not None:
            raise ProgramError(f"gen({name!r}): give dtype or regex, not both")
        if dtype not in DTYPE_REGEX:
            raise ProgramError(f"gen({name!r}): dtype must be int, float, bool or str, got {dtype!r}")
        params["regex"] = DTYPE_REGEX[dtype]
    return Expr((Gen.of(name, **params),))


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen(name, dtype=int, ...)`: an integer, as text."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """`gen(name, dtype=str, ...)`: a double-quoted string literal."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesMethod | str | None = token_length_normalized,
    **unknown: Any,
) -> Expr:
    """Choose one of `choices` by how likely the model finds each after the program's text; all
    choices are scored in one batched forward over the shared prefix."""
    require_program("select")
    _reject_unknown("select", unknown, ["name", "choices", "temperature", "choices_method"])
    plain(name, "the select name")
    plain(temperature, f"select({name!r}) temperature")
    plain(choices, f"select({name!r}) choices")
    method = choices_method if choices_method is not None else token_length_normalized
    method_name = method.name if isinstance(method, ChoicesMethod) else method
    return Expr((Select(name, tuple(choices or ()), temperature, method_name),))


def role(name: str, expr: Any) -> Expr:
    """A message of role `name` around `expr`."""
    return Expr((RoleBegin(name), *as_nodes("" if expr is None else expr), RoleEnd(name)))


def system(expr: Any = None) -> Expr:
    """A system message around `expr`, rendered with the model's chat template."""
    return role("system", expr)


def user(expr: Any = None) -> Expr:
    """A user message around `expr`, rendered with the model's chat template."""
    return role("user", expr)


def assistant(expr: Any = None) -> Expr:
    """An assistant message around `expr` (usually a gen), rendered with the model's chat template."""
    return role("assistant", expr)


def system_begin() -> Expr:
    return Expr((RoleBegin("system"),))


def system_end() -> Expr:
    return Expr((RoleEnd("system"),))


def user_begin() -> Expr:
    return Expr((RoleBegin("user"),))


def user_end() -> Expr:
    return Expr((RoleEnd("user"),))


def assistant_begin() -> Expr:
    return Expr((RoleBegin("assistant"),))


def assistant_end() -> Expr:
    return Expr((RoleEnd("assistant"),))
