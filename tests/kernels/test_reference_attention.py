"""The reference decode attention pads every row to the longest context; whatever the padding slots
hold (a CPU pool is `torch.empty`: stale memory, NaN included) must not reach the output."""

from __future__ import annotations

import torch

from sgjit.kernels import reference
from sgjit.kernels.synthetic import paged_attention_case


def test_decode_ignores_nan_in_padding_slots():
    kv_lens, page = [5, 23, 12], 8
    case = paged_attention_case([1, 1, 1], kv_lens, 4, 2, 16, page, torch.float32, torch.float32, "cpu")
    clean = reference.attention(case.q, case.kv, case.meta, 16**-0.5)
    for b, n in enumerate(kv_lens):  # the rest of each row's last page, and the scratch page
        last = case.meta.page_table[b, (n - 1) // page]
        for pool in (case.kv.k, case.kv.v):
            pool[last, (n - 1) % page + 1 :] = float("nan")
            pool[0] = float("nan")
    out = reference.attention(case.q, case.kv, case.meta, 16**-0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, clean, rtol=0, atol=0)
