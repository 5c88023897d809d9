"""The structural rules of a prompt program (roles do not nest, each variable name is used once,
scopes close in order, joins name a fork), checked node by node. `ProgramState` feeds it as the
program runs, so the error points at the offending `s += ...` line; `GraphPlan` runs it over a whole
plan, so a plan read from JSON obeys the same rules."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sgjit.compiler.nodes import (
    Arg,
    Fork,
    Gen,
    Join,
    Node,
    RoleBegin,
    RoleEnd,
    Select,
    VarScopeBegin,
    VarScopeEnd,
)
from sgjit.errors import ProgramError


class ProgramChecker:
    def __init__(self, names: Iterable[str] = (), role: str | None = None) -> None:
        self.names = set(names)  # every variable name this sequence can see
        self.created: list[str] = []  # names defined since this checker started (a branch's own)
        self.role = role
        self.scopes: list[str] = []

    def define(self, name: str) -> None:
        if name in self.names:
            raise ProgramError(
                f"variable name {name!r} is used twice in this program; give each gen, select and "
                "var_scope its own name"
            )
        self.names.add(name)
        self.created.append(name)

    def feed(self, node: Node) -> None:
        if isinstance(node, RoleBegin):
            if self.role is not None:
                raise ProgramError(
                    f"{node.role}() opened inside an open {self.role}() role; roles cannot nest: "
                    f"close the {self.role} role first ({self.role}_end() or the end of its `with` block)"
                )
            self.role = node.role
        elif isinstance(node, RoleEnd):
            if self.role != node.role:
                open_ = f"the open role is {self.role}" if self.role else "no role is open"
                raise ProgramError(f"{node.role}_end() does not match: {open_}")
            self.role = None
        elif isinstance(node, (Gen, Select)) and node.name is not None:
            self.define(node.name)
        elif isinstance(node, VarScopeBegin):
            self.define(node.name)
            self.scopes.append(node.name)
        elif isinstance(node, VarScopeEnd):
            if not self.scopes or self.scopes[-1] != node.name:
                inner = f"the innermost open scope is {self.scopes[-1]!r}" if self.scopes else "none is open"
                raise ProgramError(f"var_scope {node.name!r} ends out of order: {inner}")
            self.scopes.pop()

    def branch(self) -> ProgramChecker:
        """The checker of a fork branch: it sees the parent's names and continues its open role."""
        return ProgramChecker(self.names, self.role)

    def join(self, branches: Sequence[ProgramChecker]) -> None:
        """The names the branches created become the parent's (each a list, one value a branch)."""
        for name in dict.fromkeys(n for b in branches for n in b.created):
            self.define(name)


def check_nodes(nodes: Sequence[Node], arg_names: Sequence[str]) -> None:
    """Raise `ProgramError` unless `nodes` form a well-formed program over `arg_names`."""
    _check_sequence(nodes, ProgramChecker(), set(arg_names))


def _check_sequence(nodes: Sequence[Node], checker: ProgramChecker, args: set[str]) -> None:
    forks: dict[int, list[ProgramChecker]] = {}
    for i, node in enumerate(nodes):
        if isinstance(node, Arg):
            if node.name not in args:
                raise ProgramError(
                    f"plan node {i} uses argument {node.name!r}, which the plan does not declare"
                )
        elif isinstance(node, Fork):
            branches = [checker.branch() for _ in node.branches]
            for branch, body in zip(branches, node.branches):
                _check_sequence(body, branch, args)
            forks[i] = branches
        elif isinstance(node, Join):
            if node.fork not in forks:
                raise ProgramError(
                    f"plan node {i} joins node {node.fork}, which is not an unjoined fork before it"
                )
            checker.join(forks.pop(node.fork))
        else:
            checker.feed(node)
