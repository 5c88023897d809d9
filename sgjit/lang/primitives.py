"""The program primitives: `gen` (and its typed forms), `select`, and the chat roles. Each returns an
`Expr` of plan nodes; nothing runs until a state takes it."""

from __future__ import annotations

from typing import Any

from sgjit.compiler.nodes import Gen, RoleBegin, RoleEnd, Select
from sgjit.errors import ProgramError
from sgjit.lang.choices import ChoicesMethod, token_length_normalized
from sgjit.lang.expr import Expr, as_nodes, plain
from sgjit.lang.scope import require_program

# dtype= maps to SGLang's regexes and stops (the value stays text in the state, as the model wrote
# it, the stop trimmed). Numbers are bounded to 19 digits: a small model asked for an int may
# otherwise write digits until max_tokens.
DTYPE_REGEX: dict[type, str] = {
    int: r"[-+]?[0-9]{1,19}[ \n]*",
    float: r"[-+]?[0-9]{0,19}\.?[0-9]{1,19}[ \n]*",
    bool: r"(True|False)",
    str: r'"[\w\d\s]*"',
}
DTYPE_STOP: dict[type, tuple[str, ...]] = {int: (" ", "\n"), float: (" ", "\n")}
_DTYPE_NAMES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def _reject_unknown(primitive: str, unknown: dict[str, Any], known: list[str]) -> None:
    if unknown:
        raise ProgramError(
            f"{primitive}() got unknown keyword argument(s) {sorted(unknown)}; it takes {', '.join(known)}"
        )


_GEN_KEYWORDS = [
    "name", "max_tokens", "min_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "dtype", "choices", "choices_method",
    "regex", "json_schema",
]  # fmt: skip


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesMethod | str | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    **unknown: Any,
) -> Expr:
    """Generate text into variable `name` (parameters in SGLang's order). A parameter left None
    takes the run's default; `choices` makes it a `select`; `dtype` (int, float, bool, str, or
    their names) constrains it with SGLang's regex for the type."""
    require_program("gen")
    _reject_unknown("gen", unknown, _GEN_KEYWORDS)
    if n not in (None, 1):
        raise ProgramError(
            f"gen({name!r}, n={n!r}): a program gen draws one sample; use s.fork(n) for several"
        )
    params = {
        "max_tokens": max_tokens, "min_tokens": min_tokens, "stop": stop, "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex, "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
        "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos, "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num, "return_text_in_logprobs": return_text_in_logprobs,
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
        kind = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if regex is not None:
            raise ProgramError(f"gen({name!r}): give dtype or regex, not both")
        if kind not in DTYPE_REGEX:
            raise ProgramError(f"gen({name!r}): dtype must be int, float, bool or str, got {dtype!r}")
        params["regex"] = DTYPE_REGEX[kind]
        if kind in DTYPE_STOP:
            given = [stop] if isinstance(stop, str) else list(stop or [])
            params["stop"] = [*given, *(s for s in DTYPE_STOP[kind] if s not in given)]
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


def image(expr: Any) -> Expr:
    """SGLang's image input. sgjit serves text-only models, so a program that uses one fails here
    with a message rather than sending the model text that never shows it the image."""
    raise ProgramError(
        "sgjit.image(): this runtime serves text-only models (Llama-family decoders), which cannot see "
        "images; describe the image in text, or run the program on a vision-language model server"
    )


def video(path: str, num_frames: int) -> Expr:
    """SGLang's video input; text-only models here, so it fails the way `image` does."""
    raise ProgramError(
        "sgjit.video(): this runtime serves text-only models, which cannot see video frames; describe "
        "the video in text, or run the program on a vision-language model server"
    )
