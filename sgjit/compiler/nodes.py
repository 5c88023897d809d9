"""The nodes of a prompt program: what `s += ...` appends, what a `GraphPlan` is made of, and what the
executor runs. One vocabulary for all three, so a traced plan and an interpreted run cannot drift.

Nodes are frozen and hold only normalised values (tuples, floats where the engine takes floats), so
equal programs give equal nodes, equal JSON and equal hashes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from sgjit.errors import InvalidRequestError, ProgramError
from sgjit.runtime.sampling_params import SamplingParams

ROLES = ("system", "user", "assistant")
CHOICES_METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")
JOIN_MODES = ("gather_variable", "concate_and_append")

# gen() keyword -> the engine's sampling-parameter key
GEN_SAMPLING_KEYS = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "ignore_eos": "ignore_eos",
    "regex": "regex",
    "json_schema": "json_schema",
}


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ProgramError(message)


def _check_name(name: Any, what: str, optional: bool = True) -> None:
    if name is None and optional:
        return
    _need(isinstance(name, str) and name != "", f"{what} name must be a non-empty string, got {name!r}")


@dataclass(frozen=True, slots=True)
class ConstText:
    kind: ClassVar[str] = "text"
    text: str

    def __post_init__(self) -> None:
        _need(isinstance(self.text, str), f"constant text must be a string, got {type(self.text).__name__}")


@dataclass(frozen=True, slots=True)
class Arg:
    """Where a program argument's text goes; bound when the plan runs."""

    kind: ClassVar[str] = "arg"
    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "argument", optional=False)


@dataclass(frozen=True, slots=True)
class RoleBegin:
    kind: ClassVar[str] = "role_begin"
    role: str

    def __post_init__(self) -> None:
        _need(self.role in ROLES, f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")


@dataclass(frozen=True, slots=True)
class RoleEnd:
    kind: ClassVar[str] = "role_end"
    role: str

    def __post_init__(self) -> None:
        _need(self.role in ROLES, f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")


@dataclass(frozen=True, slots=True)
class Gen:
    """A generation step. A field left None takes the run's default."""

    kind: ClassVar[str] = "gen"
    name: str | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    regex: str | None = None
    json_schema: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "gen")
        given = {
            key: getattr(self, f) for f, key in GEN_SAMPLING_KEYS.items() if getattr(self, f) is not None
        }
        try:
            params = SamplingParams.from_dict(given)
        except InvalidRequestError as e:
            dsl = {v: k for k, v in GEN_SAMPLING_KEYS.items()}.get(e.param or "", e.param)
            raise ProgramError(f"gen({self.name!r}): invalid {dsl}: {e}") from e
        for f, key in GEN_SAMPLING_KEYS.items():  # store the engine's normalised values
            if getattr(self, f) is not None:
                value = getattr(params, key)
                object.__setattr__(self, f, tuple(value) if isinstance(value, list) else value)
        _need(
            self.return_logprob is None or isinstance(self.return_logprob, bool),
            f"gen({self.name!r}): return_logprob must be True or False",
        )
        n = self.top_logprobs_num
        _need(
            n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0),
            f"gen({self.name!r}): top_logprobs_num must be an integer >= 0",
        )

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling parameters this gen sets, under the engine's keys."""
        out = {}
        for f, key in GEN_SAMPLING_KEYS.items():
            value = getattr(self, f)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class Select:
    kind: ClassVar[str] = "select"
    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    choices_method: str = "token_length_normalized"

    def __post_init__(self) -> None:
        _check_name(self.name, "select")
        _need(
            isinstance(self.choices, tuple) and len(self.choices) > 0,
            f"select({self.name!r}) has no choices; give a non-empty list, e.g. choices=['yes', 'no']",
        )
        _need(
            all(isinstance(c, str) and c for c in self.choices),
            f"select({self.name!r}): every choice must be a non-empty string, got {list(self.choices)!r}",
        )
        _need(
            isinstance(self.temperature, (int, float))
            and not isinstance(self.temperature, bool)
            and self.temperature >= 0,
            f"select({self.name!r}): temperature must be a number >= 0, got {self.temperature!r}",
        )
        object.__setattr__(self, "temperature", float(self.temperature))
        _need(
            self.choices_method in CHOICES_METHODS,
            f"select({self.name!r}): unknown choices_method {self.choices_method!r}; "
            f"use one of {', '.join(CHOICES_METHODS)}",
        )


@dataclass(frozen=True, slots=True)
class VarScopeBegin:
    kind: ClassVar[str] = "var_scope_begin"
    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "var_scope", optional=False)


@dataclass(frozen=True, slots=True)
class VarScopeEnd:
    kind: ClassVar[str] = "var_scope_end"
    name: str

    def __post_init__(self) -> None:
        _check_name(self.name, "var_scope", optional=False)


@dataclass(frozen=True, slots=True)
class Fork:
    """The program splits into branches that continue from here, each with its own nodes."""

    kind: ClassVar[str] = "fork"
    branches: tuple[tuple[Node, ...], ...]

    def __post_init__(self) -> None:
        _need(len(self.branches) >= 1, "fork needs at least one branch")


@dataclass(frozen=True, slots=True)
class Join:
    """Gathers the branches of the Fork at index `fork` of the same node sequence."""

    kind: ClassVar[str] = "join"
    fork: int
    mode: str = "gather_variable"

    def __post_init__(self) -> None:
        _need(self.mode in JOIN_MODES, f"unknown join mode {self.mode!r}; use one of {', '.join(JOIN_MODES)}")


Node = ConstText | Arg | RoleBegin | RoleEnd | Gen | Select | VarScopeBegin | VarScopeEnd | Fork | Join

NODE_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (ConstText, Arg, RoleBegin, RoleEnd, Gen, Select, VarScopeBegin, VarScopeEnd, Fork, Join)
}


def node_to_dict(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": node.kind}
    for f in fields(node):
        value = getattr(node, f.name)
        if value is None:
            continue  # unset gen fields stay out, so adding a field later keeps old hashes
        if isinstance(node, Fork):
            value = [[node_to_dict(n) for n in branch] for branch in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def node_from_dict(data: Any) -> Node:
    _need(isinstance(data, dict) and data.get("kind") in NODE_TYPES, f"not a plan node: {data!r}")
    cls = NODE_TYPES[data["kind"]]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known - {"kind"})
    _need(not unknown, f"plan node {data['kind']!r} has unknown field(s) {unknown}")
    kwargs = {}
    for key, value in data.items():
        if key == "kind":
            continue
        if cls is Fork:
            value = tuple(tuple(node_from_dict(n) for n in branch) for branch in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ProgramError(f"plan node {data['kind']!r} is incomplete: {e}") from e
