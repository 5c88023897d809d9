"""The reference decode attention pads every row to the longest context; whatever the padding slots
hold (a CPU pool is `torch.empty`: stale memory, NaN included) must not reach the output. Storing
into an fp8 pool saturates at the format's largest finite value, as the kernels' conversion does."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp8_store_saturates_past_the_scale(device):
    """A key past its layer's calibrated scale (|x| / scale > 448) lands as +-448, as the CUDA store
    (cvt .satfinite) writes it; torch's own cast on CUDA (c10's scalar conversion) makes it NaN."""
    case = paged_attention_case([1], [4], 2, 2, 16, 4, torch.float32, torch.float8_e4m3fn, device)
    kv = case.kv
    k = torch.full((1, 2, 16), 3.0, device=device)
    k[0, 0, :4] = torch.tensor([1000.0, -1000.0, 449.0, 0.5])
    reference.store_kv(k, k.clone(), kv, torch.tensor([1], device=device))
    stored = kv.k.view(-1, 2, 16)[1].float() * kv.k_scale
    assert torch.isfinite(stored).all()
    assert stored[0, :4].tolist() == [448.0, -448.0, 448.0, 0.5]
