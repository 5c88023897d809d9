"""Running a `GraphPlan` with bound arguments: its nodes are handed to program executors — the same
executors an interpreted run feeds — so a traced and an interpreted run of one program take the same
steps. A compiled plan changes how the executor tokenizes and admits its steps, not this walk."""

from __future__ import annotations

from collections.abc import Mapping

from sgjit.compiler.nodes import Arg, ConstText, Fork, Join, Node
from sgjit.compiler.plan import GraphPlan
from sgjit.lang.executor import ProgramExecutor


def run_plan(plan: GraphPlan, args: Mapping[str, str], root: ProgramExecutor) -> None:
    """Queue every node of `plan` on `root` (and on the branches its forks create)."""
    _walk(plan.nodes, args, root)


def _walk(nodes: tuple[Node, ...], args: Mapping[str, str], executor: ProgramExecutor) -> None:
    forks: dict[int, list[ProgramExecutor]] = {}
    for i, node in enumerate(nodes):
        if isinstance(node, Arg):
            executor.append(ConstText(args[node.name]))
        elif isinstance(node, Fork):
            branches = executor.fork(len(node.branches))
            for branch, body in zip(branches, node.branches):
                _walk(body, args, branch)
            forks[i] = branches
        elif isinstance(node, Join):
            executor.join(forks.pop(node.fork), node.mode)
        else:
            executor.append(node)
