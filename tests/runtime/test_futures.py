"""Token futures: the placeholder ids a launch in flight hands out, and their resolution on the device."""

from __future__ import annotations

import torch

from sgjit.runtime.futures import TokenFutures


def test_a_rows_placeholders_are_its_cells_step_by_step():
    """`placeholders(row, n)` names the same cells as `placeholder(k, row)` for k < n, every id is
    negative and distinct, and `resolve` reads each back from its cell."""
    f = TokenFutures(steps=8, width=5, device=torch.device("cpu"))
    for row in range(5):
        for n in range(9):
            assert list(f.placeholders(row, n)) == [f.placeholder(k, row) for k in range(n)]
    ids = [p for row in range(5) for p in f.placeholders(row, 8)]
    assert len(set(ids)) == 40 and max(ids) < 0
    f.tokens.copy_(torch.arange(40).reshape(8, 5) + 1000)
    got = f.resolve(torch.tensor([7, *f.placeholders(3, 4)]))
    assert got.tolist() == [7, 1003, 1008, 1013, 1018]
