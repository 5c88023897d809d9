"""`reload_function` picks up an edited source file, rebinds the module's name, re-traces, and tells
the backends to drop the old plan when its hash changed."""

from __future__ import annotations

import importlib
import sys

import pytest

import sgjit as sgl
from sgjit.errors import ProgramError
from sgjit.lang.runtime_backend import RuntimeBackend

SOURCE = """
import sgjit

GREETING = "Hello"


def helper(name):
    return GREETING + ", " + name


@sgjit.function(jit=True)
def greet(s, name):
    # a comment
    s += helper(name) + "{punct}"
    s += sgjit.gen("rest", max_tokens=2, ignore_eos=True)
"""


class RecordingBackend(RuntimeBackend):
    """The in-process backend, recording the invalidation hook's calls."""

    def __init__(self, runtime) -> None:
        super().__init__(runtime)
        self.invalidated: list[str] = []

    def invalidate_plan(self, plan_hash: str) -> None:
        self.invalidated.append(plan_hash)


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "edited_program.py"
    path.write_text(SOURCE.format(punct="!"))
    sys.path.insert(0, str(tmp_path))
    try:
        yield path, importlib.import_module("edited_program")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("edited_program", None)


def test_reload_picks_up_the_edit_and_invalidates_the_old_plan(module, runtime):
    path, mod = module
    backend = RecordingBackend(runtime)
    old = mod.greet
    first = old.run(name="Ann", temperature=0, backend=backend)
    assert first.text().startswith("Hello, Ann!")
    old_hash = first.plan_hash

    path.write_text(SOURCE.format(punct="?"))
    new = sgl.reload_function(old)
    assert new is not old and mod.greet is new and new.jit is True
    assert new.trace().plan_hash != old_hash
    assert backend.invalidated == [old_hash]
    assert backend.lookup_function("greet") is new
    second = new.run(name="Ann", temperature=0, backend=backend)
    assert second.text().startswith("Hello, Ann?")

    # An edit that leaves the program as it was (a comment) keeps the plan: nothing to invalidate.
    before = new.trace()
    path.write_text(SOURCE.format(punct="?").replace("# a comment", "# another comment"))
    same = sgl.reload_function("greet", backend=backend)
    after = same.trace()
    assert same is not new and after.plan_hash == before.plan_hash and after.source_hash != before.source_hash
    assert backend.invalidated == [old_hash]


def test_reload_by_name_needs_a_function_that_ran_there(runtime):
    with pytest.raises(ProgramError, match="no program function named 'never_ran'"):
        sgl.reload_function("never_ran", backend=runtime)


def test_reload_needs_a_module_level_function():
    @sgl.function
    def local(s):
        s += "x"

    with pytest.raises(ProgramError, match="needs a module-level function"):
        sgl.reload_function(local)
