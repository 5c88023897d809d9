"""transfer.py's driver copies on a GPU: strided blocks both ways land where torch's own copies put
them, and a read-back's pinned buffer is lent again once released."""

from __future__ import annotations

import pytest
import torch

from sgjit.runtime.transfer import CornerCopy, PinnedBuffers, Readback, copy_async

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (1, 37), (9, 1), (32, 40), (256, 512)])
def test_host_block_into_device_slice(rows, cols):
    table = torch.full((256, 512), -1, dtype=torch.int32, device="cuda")
    host = torch.randint(0, 1 << 30, (rows, cols), dtype=torch.int32).pin_memory()
    copy_async(table[:rows, :cols], host)
    expect = torch.full((256, 512), -1, dtype=torch.int32)
    expect[:rows, :cols] = host
    assert torch.equal(table.cpu(), expect)  # nothing outside the block was touched


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (9, 1), (9, 64), (32, 40)])
def test_corner_copy_into_device_buffer(rows, cols):
    table = torch.full((256, 512), -1, dtype=torch.int64, device="cuda")
    host = torch.randint(0, 1 << 40, (300, 600), dtype=torch.int64).pin_memory()
    CornerCopy(table, host)(rows, cols)
    expect = torch.full((256, 512), -1, dtype=torch.int64)
    expect[:rows, :cols] = host[:rows, :cols]
    assert torch.equal(table.cpu(), expect)


def test_readback_of_column_slices_and_buffer_reuse():
    pool = PinnedBuffers()
    cells = torch.arange(8 * 256, dtype=torch.int64, device="cuda").view(8, 256)
    logp = torch.randn(5, device="cuda")
    first = Readback([cells[:, :3], logp], pool)
    cells.add_(1)  # queued after the copies: the read-back holds the values before it
    tokens, values = first.wait()
    assert torch.equal(tokens, (cells[:, :3] - 1).cpu()) and torch.equal(values, logp.cpu())
    buffer = first._lent[0]
    first.release()
    second = Readback([cells[:, :1]], pool)
    assert second._lent[0].data_ptr() == buffer.data_ptr()  # lent again, not allocated
    assert torch.equal(second.wait()[0], cells[:, :1].cpu())
    second.release()
