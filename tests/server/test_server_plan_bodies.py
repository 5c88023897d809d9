"""Malformed `/plans` bodies: a plan JSON with a wrong type anywhere is a 400 naming the field
(`ProgramError`), never a 500 TypeError. Fuzzed by substituting values of other types at every
position of a valid plan, in process and through the server."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from sgjit.compiler.plan import GraphPlan
from sgjit.errors import ProgramError

from server_harness import LiveServer

PLAN: dict[str, Any] = {
    "format": "sgjit.plan/1",
    "name": "fuzzed",
    "args": ["topic"],
    "nodes": [
        {"kind": "role_begin", "role": "user"},
        {"kind": "text", "text": "Tell me about "},
        {"kind": "arg", "name": "topic"},
        {"kind": "role_end", "role": "user"},
        {"kind": "fork", "branches": [[{"kind": "text", "text": "A"}], [{"kind": "text", "text": "B"}]]},
        {"kind": "join", "fork": 4, "mode": "gather_variable"},
        {"kind": "gen", "name": "answer", "max_tokens": 4, "temperature": 0.0, "stop": ["\n"]},
        {"kind": "select", "name": "kind", "choices": ["yes", "no"], "temperature": 0.0},
        {"kind": "var_scope_begin", "name": "scope"},
        {"kind": "var_scope_end", "name": "scope"},
    ],
    "source_hash": "",
}
SUBSTITUTES = [None, 7, -1, 2.5, True, "x", "", [], [1], {}, {"kind": "text"}]


def positions(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every value inside a JSON value (the root excluded)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*path, key)
        yield from positions(child, (*path, key))


def substituted(path: tuple, new: Any) -> dict[str, Any]:
    data = copy.deepcopy(PLAN)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return data


VARIANTS = [substituted(p, v) for p in positions(PLAN) for v in SUBSTITUTES]


def test_the_base_plan_is_valid():
    assert GraphPlan.from_json(json.dumps(PLAN)).name == "fuzzed"


def test_every_type_substitution_is_a_program_error_or_a_plan():
    failures = []
    for data in VARIANTS:
        try:
            GraphPlan.from_json(json.dumps(data))
        except ProgramError:
            pass
        except Exception as e:  # noqa: BLE001 - the test collects what should have been a ProgramError
            failures.append(f"{type(e).__name__}: {e} <- {json.dumps(data)[:200]}")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("nodes", "abc", "'nodes'"),
        ("nodes", {"kind": "text"}, "'nodes'"),
        ("args", "topic", "'args'"),
        ("args", [1], "'args'"),
        ("name", 5, "'name'"),
        ("plan_hash", 5, "'plan_hash'"),
    ],
)
def test_top_level_fields_are_named(field, value, named):
    with pytest.raises(ProgramError, match=named):
        GraphPlan.from_json(json.dumps({**PLAN, field: value}))


def test_nested_errors_say_where():
    with pytest.raises(ProgramError, match=r"nodes\[4\]\.branches must be a list"):
        GraphPlan.from_json(json.dumps(substituted(("nodes", 4, "branches"), 5)))
    with pytest.raises(ProgramError, match=r"nodes\[4\]\.branches\[1\]\[0\]"):
        GraphPlan.from_json(json.dumps(substituted(("nodes", 4, "branches", 1, 0, "text"), [])))
    with pytest.raises(ProgramError, match=r"nodes\[5\]\.fork must be a node index"):
        GraphPlan.from_json(json.dumps(substituted(("nodes", 5, "fork"), [])))


@pytest.fixture(scope="module")
def http(runtime):
    srv = LiveServer(runtime)
    with srv.client() as c:
        yield c
    srv.stop()


def test_server_answers_malformed_plans_with_400(http):
    bodies = [{"plan": v} for v in random.Random(18).sample(VARIANTS, 40)]
    bodies += [
        {"plan": {**PLAN, "nodes": 5}},
        {"plan": {**PLAN, "args": {"a": 1}}},
        {"plan": 5},
        {"plan": []},
    ]
    for body in bodies:
        r = http.post("/plans", json=body)
        assert r.status_code in (200, 400), (r.status_code, r.text, body)
        if r.status_code == 400:
            error = r.json()["error"]
            assert error["message"] and error["code"] in ("invalid_program", "invalid_value"), error
    assert http.post("/plans", json={"plan": PLAN}).status_code == 200
    assert http.get("/health").status_code == 200
