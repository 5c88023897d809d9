"""`CompiledPlan`: what the JIT makes of a `GraphPlan` for one runtime (model x device).

- the constant prefix (everything before the first argument or generation) rendered and tokenized
  once, with its stable boundary (prefix.py), and prefilled once and pinned in the prefix cache for
  as long as the plan stays compiled, so a run prefills only its arguments;
- the worst-case context (prefix + argument budget + every gen's max tokens), checked against the
  context and the KV pool: a plan that can never fit is rejected here, not mid-run;
- the kernel set the selector chose and the decode-graph buckets (shared by every plan of the
  runtime), for `explain()`.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sgjit.compiler.chat import STATIC_NODES
from sgjit.compiler.nodes import Fork, Gen, Node, Select
from sgjit.compiler.plan import GraphPlan
from sgjit.compiler.prefix import PrefixTokens

if TYPE_CHECKING:
    from sgjit.runtime.request import PrefixHandle

log = logging.getLogger(__name__)


def leading_static_nodes(plan: GraphPlan) -> list[Node]:
    """The nodes before the first argument, gen, select or fork: text known at compile time."""
    out = []
    for node in plan.nodes:
        if not isinstance(node, STATIC_NODES):
            break
        out.append(node)
    return out


def max_new_tokens(nodes: tuple[Node, ...], default: int, choice_tokens: Any) -> int:
    """Tokens the plan's gens and selects may add, forks' branches included."""
    total = 0
    for node in nodes:
        if isinstance(node, Gen):
            total += node.max_tokens if node.max_tokens is not None else default
        elif isinstance(node, Select):
            total += max(len(choice_tokens(c)) for c in node.choices)
        elif isinstance(node, Fork):
            total += sum(max_new_tokens(b, default, choice_tokens) for b in node.branches)
    return total


@dataclass(eq=False)
class CompiledPlan:
    plan: GraphPlan
    arch: str  # "sm_90" | "cpu-x86_64"
    arch_hash: str
    prefix: PrefixTokens
    max_new_tokens: int
    worst_case_tokens: int
    compile_ms: float = 0.0
    from_disk: bool = False
    kernels: str = ""
    graph_buckets: str = ""
    handle: PrefixHandle | None = None
    _runtime: weakref.ref = field(default=lambda: None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.plan.name}_{len(self.prefix.ids)}_{self.max_new_tokens}"

    def encode(self, text: str, add_special: bool) -> list[int] | None:
        """The step tokenization with the prefix's tokens reused (None: tokenize it all)."""
        runtime = self._runtime()
        if runtime is None or add_special != self.prefix.add_special:
            return None
        return self.prefix.encode(runtime.tokenizer, text)

    def release(self) -> None:
        """Unpin the prefix (on eviction, invalidation or clear)."""
        runtime, handle = self._runtime(), self.handle
        self.handle = None
        if runtime is not None and handle is not None:
            runtime.release(handle)

    @property
    def pinned_tokens(self) -> int:
        return len(self.handle.token_ids) if self.handle is not None else 0

    def explain(self) -> str:
        runtime = self._runtime()
        encode = (lambda t: runtime.tokenizer.encode(t, add_special_tokens=False)) if runtime else None
        page = runtime.pool.page_size if runtime else 16
        lines = [
            self.plan.dump(encode),
            "",
            f"compiled as {self.label} for arch {self.arch} (arch hash {self.arch_hash[:12]}), "
            f"{self.compile_ms:.1f} ms{' from the disk cache' if self.from_disk else ''}",
            f"constant prefix: {len(self.prefix.ids)} tokens, {self.pinned_tokens} pinned in the prefix cache; "
            f"first {self.prefix.stable} reused by every run",
            f"memory reservation: worst case {self.worst_case_tokens} tokens "
            f"({-(-self.worst_case_tokens // page)} pages of {page}) = prefix + argument budget + "
            f"{self.max_new_tokens} generated",
            "kernels:",
            *("  " + line for line in (self.kernels or "torch reference ops").splitlines()),
            f"decode graphs: {self.graph_buckets or 'none (CPU, or JIT graphs disabled)'}",
        ]
        return "\n".join(lines)
