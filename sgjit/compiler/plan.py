"""`GraphPlan`: a traced prompt program as immutable data, the key of everything the compiler caches.

The canonical byte form is sorted, compact JSON of the program itself (format tag, function name,
argument names, nodes); `plan_hash` is its xxhash64, so it is the same in every process and on every
machine. `source_hash` is provenance and stays out of the hash: an edit that leaves the program
unchanged (a comment, a rename of a local) keeps the compiled artefacts valid."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from sgjit.compiler import nodes as N
from sgjit.compiler.nodes import Node, node_from_dict, node_to_dict
from sgjit.compiler.plan_check import check_nodes
from sgjit.errors import ProgramError

PLAN_FORMAT = "sgjit.plan/1"


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class GraphPlan:
    name: str
    arg_names: tuple[str, ...]
    nodes: tuple[Node, ...]
    source_hash: str = ""
    plan_hash: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_nodes(self.nodes, self.arg_names)
        object.__setattr__(self, "plan_hash", xxhash.xxh64_hexdigest(self.canonical_bytes()))

    def _program(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "name": self.name,
            "args": list(self.arg_names),
            "nodes": [node_to_dict(n) for n in self.nodes],
        }

    def text_args(self) -> list[str]:
        """The arguments whose values the plan inserts as text, in order of first use."""
        names: dict[str, None] = {}
        _collect_args(self.nodes, names)
        return list(names)

    def canonical_bytes(self) -> bytes:
        return _canonical(self._program()).encode("utf-8")

    def to_json(self) -> str:
        return _canonical({**self._program(), "source_hash": self.source_hash, "plan_hash": self.plan_hash})

    @classmethod
    def from_json(cls, text: str | bytes) -> GraphPlan:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProgramError(f"a GraphPlan must be JSON from GraphPlan.to_json(): {e}") from e
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise ProgramError(f"not a {PLAN_FORMAT} plan; was it written by another sgjit version?")
        name, args, nodes = data.get("name", ""), data.get("args", []), data.get("nodes", [])
        source_hash, claimed = data.get("source_hash", ""), data.get("plan_hash")
        for key, ok, want in (
            ("name", isinstance(name, str), "a string"),
            ("args", isinstance(args, list) and all(isinstance(a, str) for a in args), "a list of strings"),
            ("nodes", isinstance(nodes, list), "a list of nodes"),
            ("source_hash", isinstance(source_hash, str), "a string"),
            ("plan_hash", claimed is None or isinstance(claimed, str), "a string"),
        ):
            if not ok:
                raise ProgramError(f"plan field {key!r} must be {want}; send GraphPlan.to_json() unchanged")
        plan = cls(
            name=name,
            arg_names=tuple(args),
            nodes=tuple(node_from_dict(n, f"nodes[{i}]") for i, n in enumerate(nodes)),
            source_hash=source_hash,
        )
        if claimed is not None and claimed != plan.plan_hash:
            raise ProgramError(
                f"plan hash mismatch: the JSON says {claimed}, its content hashes to {plan.plan_hash}"
            )
        return plan

    def dump(self, encode: Callable[[str], list[int]] | None = None) -> str:
        """One line a node: index, kind, name, parameters, token estimate. Constant text is counted
        with `encode` when given, else estimated at four characters a token."""
        args = ", ".join(self.arg_names)
        lines = [f"plan {self.name}({args}) hash={self.plan_hash} nodes={len(self.nodes)}"]
        _dump_nodes(self.nodes, "", encode, lines)
        return "\n".join(lines)


def _collect_args(nodes: tuple[Node, ...], out: dict[str, None]) -> None:
    for node in nodes:
        if isinstance(node, N.Arg):
            out[node.name] = None
        elif isinstance(node, N.Fork):
            for branch in node.branches:
                _collect_args(branch, out)


def _dump_nodes(
    nodes: tuple[Node, ...], prefix: str, encode: Callable[[str], list[int]] | None, out: list[str]
) -> None:
    for i, node in enumerate(nodes):
        name, params, tokens = _describe(node, encode)
        index = f"{prefix}{i}"
        out.append(f"{index:>6}  {node.kind:<16} {name or '-':<14} {params:<44} {tokens}".rstrip())
        if isinstance(node, N.Fork):
            for b, branch in enumerate(node.branches):
                out.append(f"{'':>6}  branch {b}")
                _dump_nodes(branch, f"{index}.{b}.", encode, out)


def _estimate(text: str, encode: Callable[[str], list[int]] | None) -> str:
    if encode is not None:
        return f"{len(encode(text))} tok"
    return f"~{max(1, math.ceil(len(text) / 4))} tok"


def _describe(node: Node, encode: Callable[[str], list[int]] | None) -> tuple[str | None, str, str]:
    if isinstance(node, N.ConstText):
        preview = node.text if len(node.text) <= 40 else node.text[:37] + "..."
        return None, repr(preview), _estimate(node.text, encode)
    if isinstance(node, N.Arg):
        return node.name, "", "? tok"
    if isinstance(node, (N.RoleBegin, N.RoleEnd)):
        return node.role, "", "template"
    if isinstance(node, N.Gen):
        params = {k: v for k, v in node_to_dict(node).items() if k not in ("kind", "name")}
        limit = f"<={node.max_tokens} tok" if node.max_tokens is not None else "<=default tok"
        return node.name, " ".join(f"{k}={v!r}" for k, v in params.items()), limit
    if isinstance(node, N.Select):
        params = f"choices={list(node.choices)!r} method={node.choices_method}"
        return node.name, params, _estimate(max(node.choices, key=len), encode)
    if isinstance(node, (N.VarScopeBegin, N.VarScopeEnd)):
        return node.name, "", ""
    if isinstance(node, N.Fork):
        return None, f"n={len(node.branches)}", ""
    if isinstance(node, N.Join):
        return None, f"fork={node.fork} mode={node.mode}", ""
    raise ProgramError(f"unknown plan node {node!r}")
