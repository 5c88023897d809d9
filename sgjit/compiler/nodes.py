"""The nodes of a prompt program: what `s += ...` appends, what a `GraphPlan` is made of, and what the
executor runs. One vocabulary for all three, so a traced plan and an interpreted run cannot drift.

Nodes are frozen and hold only normalised values (tuples, floats where the engine takes floats), so
equal programs give equal nodes, equal JSON and equal hashes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from sgjit.errors import InvalidRequestError, ProgramError
from sgjit.runtime.sampling_params import GEN_KEYS, SamplingParams

ROLES = ("system", "user", "assistant")
CHOICES_METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")
JOIN_MODES = ("gather_variable", "concate_and_append")


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
    """A generation step. `sampling` holds the sampling parameters this gen sets, normalised by
    `SamplingParams` (sorted (field, value) pairs, lists as tuples); the rest take the run's
    defaults. Build one with `Gen.of(name, max_tokens=..., ...)`, in gen()'s keywords; those also
    read back as attributes (`node.max_tokens`, None when unset)."""

    kind: ClassVar[str] = "gen"
    name: str | None = None
    sampling: tuple[tuple[str, Any], ...] = ()
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    logprob_start_len: int | None = None
    return_text_in_logprobs: bool | None = None

    @classmethod
    def of(
        cls,
        name: str | None = None,
        *,
        return_logprob: bool | None = None,
        top_logprobs_num: int | None = None,
        logprob_start_len: int | None = None,
        return_text_in_logprobs: bool | None = None,
        **params: Any,
    ) -> Gen:
        """A gen from gen()'s keywords, validated as the engine will read them."""
        unknown = sorted(set(params) - set(GEN_KEYS))
        _need(not unknown, f"gen({name!r}) has no parameter(s) {unknown}; it takes {sorted(GEN_KEYS)}")
        given = {GEN_KEYS[k]: v for k, v in params.items() if v is not None}
        try:
            sp = SamplingParams.from_dict(given)
        except InvalidRequestError as e:
            dsl = {v: k for k, v in GEN_KEYS.items()}.get(e.param or "", e.param)
            raise ProgramError(f"gen({name!r}): invalid {dsl}: {e}") from e
        sampling = tuple(sorted((key, _frozen(getattr(sp, key))) for key in given))
        return cls(
            name, sampling, return_logprob, top_logprobs_num, logprob_start_len, return_text_in_logprobs
        )

    def __post_init__(self) -> None:
        _check_name(self.name, "gen")
        _need(
            self.return_logprob is None or isinstance(self.return_logprob, bool),
            f"gen({self.name!r}): return_logprob must be True or False",
        )
        for f, low in (("top_logprobs_num", 0), ("logprob_start_len", -1)):
            n = getattr(self, f)
            _need(
                n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= low),
                f"gen({self.name!r}): {f} must be an integer >= {low}",
            )
        _need(
            self.return_text_in_logprobs is None or isinstance(self.return_text_in_logprobs, bool),
            f"gen({self.name!r}): return_text_in_logprobs must be True or False",
        )

    def __getattr__(self, attr: str) -> Any:
        key = GEN_KEYS.get(attr)
        if key is None:
            raise AttributeError(attr)
        return dict(self.sampling).get(key)

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling parameters this gen sets, under `SamplingParams` names."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in self.sampling}

    def to_fields(self) -> dict[str, Any]:
        """The gen as gen()'s keywords (its JSON form: unset fields stay out)."""
        by_key = {v: k for k, v in GEN_KEYS.items()}
        out: dict[str, Any] = {"name": self.name} if self.name is not None else {}
        out.update((by_key[key], value) for key, value in self.sampling)
        for f in ("return_logprob", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs"):
            if getattr(self, f) is not None:
                out[f] = getattr(self, f)
        return out


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


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
    if isinstance(node, Gen):
        out.update((k, list(v) if isinstance(v, tuple) else v) for k, v in node.to_fields().items())
        return out
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


def node_from_dict(data: Any, path: str = "node") -> Node:
    """A node from its JSON form; `path` (e.g. `nodes[3].branches[0][1]`) leads every error, so a
    client sees which part of a plan body is wrong."""
    try:
        return _node_from_dict(data, path)
    except ProgramError as e:
        if str(e).startswith(path):
            raise
        raise ProgramError(f"{path}: {e}") from e
    except TypeError as e:  # a value of a type no field check foresaw
        raise ProgramError(f"{path}: a field has the wrong type ({e})") from e


def _node_from_dict(data: Any, path: str) -> Node:
    _need(isinstance(data, dict) and data.get("kind") in NODE_TYPES, f"{path} is not a plan node: {data!r}")
    cls = NODE_TYPES[data["kind"]]
    if cls is Gen:
        return Gen.of(**{k: v for k, v in data.items() if k != "kind"})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known - {"kind"})
    _need(not unknown, f"plan node {data['kind']!r} has unknown field(s) {unknown}")
    kwargs = {}
    for key, value in data.items():
        if key == "kind":
            continue
        if cls is Fork:
            _need(
                isinstance(value, list) and all(isinstance(b, list) for b in value),
                f"{path}.branches must be a list of branches, each a list of nodes",
            )
            value = tuple(
                tuple(node_from_dict(n, f"{path}.branches[{b}][{j}]") for j, n in enumerate(branch))
                for b, branch in enumerate(value)
            )
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    if cls is Join:
        fork = kwargs.get("fork")
        _need(isinstance(fork, int) and not isinstance(fork, bool), f"{path}.fork must be a node index")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ProgramError(f"plan node {data['kind']!r} is incomplete: {e}") from e
