"""The house has one direction: apps (the package API, cli, bench) → server → lang → compiler →
runtime → kernels → ground floor (errors, settings, nvtx, version). Every import statement in
sgjit — inside functions and under `if TYPE_CHECKING:` included — may name only its own layer or
one below it, and no two subpackages import each other, directly or around a cycle."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import sgjit

ROOT = Path(sgjit.__file__).parent

# bottom to top; a module belongs to the first entry its name starts with, longest prefix first
LAYERS: dict[str, tuple[str, ...]] = {
    "ground": ("sgjit.errors", "sgjit.settings", "sgjit.nvtx", "sgjit.version"),
    "kernels": ("sgjit.kernels",),
    "runtime": ("sgjit.runtime",),
    "compiler": ("sgjit.compiler",),
    "lang": ("sgjit.lang",),
    "server": ("sgjit.server",),
    "apps": ("sgjit.bench", "sgjit.cli", "sgjit.explain", "sgjit.generate", "sgjit"),
}
ORDER = list(LAYERS)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    base = ROOT.parent / rel
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imported(path: Path) -> set[str]:
    """Every sgjit module the file imports, wherever the statement stands."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from sgjit import errors` imports the module sgjit.errors
                sub = f"{target}.{alias.name}"
                out.add(sub if is_module(sub) else target)
    return {m for m in out if m == "sgjit" or m.startswith("sgjit.")}


def layer_of(module: str) -> str:
    best = max(
        ((layer, prefix) for layer, prefixes in LAYERS.items() for prefix in prefixes
         if module == prefix or module.startswith(prefix + ".")),
        key=lambda lp: len(lp[1]),
    )  # fmt: skip
    return best[0]


def package_of(module: str) -> str:
    """The room a module lives in: its top-level subpackage (sgjit.runtime for sgjit.runtime.model.llama),
    or the module itself when it lies directly under sgjit/ (errors, cli, the package's __init__).
    Nested packages are parts of one room: runtime/assembly.py building runtime/model is no cycle."""
    parts = module.split(".")
    return ".".join(parts[:2])


def graph() -> dict[str, set[str]]:
    return {module_name(p): imported(p) for p in ROOT.rglob("*.py")}


def test_the_walker_sees_type_only_and_function_level_imports(tmp_path):
    src = ROOT / "runtime" / "runtime.py"
    assert "sgjit.runtime.assembly" in imported(src)
    assert layer_of("sgjit.kernels.cuda.attention") == "kernels" and layer_of("sgjit") == "apps"
    # a file with only a TYPE_CHECKING import and a function-level one
    probe = ROOT / "lang" / "state.py"
    assert any(m.startswith("sgjit.compiler") for m in imported(probe))


def test_no_module_imports_a_layer_above_it():
    upward = []
    for module, targets in sorted(graph().items()):
        mine = ORDER.index(layer_of(module))
        for target in sorted(targets):
            theirs = ORDER.index(layer_of(target))
            if theirs > mine:
                upward.append(f"{module} ({ORDER[mine]}) imports {target} ({ORDER[theirs]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_subpackages():
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        src = package_of(module)
        for target in targets:
            dst = package_of(target)
            if dst != src:
                edges.setdefault(src, set()).add(dst)

    # a cycle shows as a pair of packages each reachable from the other
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    closure = {p: reach(p) for p in edges}
    cycles = sorted({tuple(sorted((a, b))) for a, b in itertools.permutations(edges, 2)
                     if b in closure[a] and a in closure.get(b, set())})  # fmt: skip
    assert not cycles, f"subpackages that import each other: {cycles}"
