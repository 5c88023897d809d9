"""transfer.py's copies without a GPU: what a strided copy hands the driver's cuMemcpy2DAsync (the
driver replaced by a recorder, so the rows, widths and pitches of the decode path's copies are
checked), the layouts it refuses, and the CPU path. tests/runtime/test_transfer_gpu.py runs the real
copies."""

from __future__ import annotations

import ctypes

import pytest
import torch

from sgjit.kernels.cuda import driver
from sgjit.runtime import transfer


def _record(monkeypatch) -> list[dict]:
    seen = []

    def fn(spec_ref, stream):
        s = ctypes.cast(spec_ref, ctypes.POINTER(driver._Memcpy2D)).contents
        seen.append(dict(
            src=s.src_device, src_pitch=s.src_pitch, dst=s.dst_device, dst_pitch=s.dst_pitch,
            width=s.width_bytes, height=s.height, stream=stream, kinds=(s.src_memory_type, s.dst_memory_type),
        ))  # fmt: skip
        return 0

    spec = driver._Memcpy2D()
    spec.src_memory_type = spec.dst_memory_type = driver._UNIFIED
    monkeypatch.setattr(driver, "_memcpy_2d", lambda: (fn, spec))
    monkeypatch.setattr(transfer, "memcpy_2d_async", driver.memcpy_2d_async)
    monkeypatch.setattr(transfer, "current_stream_handle", lambda: 0x5)
    return seen


class _OnGpu(torch.Tensor):
    """A CPU tensor that reports a CUDA device, so copy_async takes the driver path."""

    @property
    def device(self):  # type: ignore[override]
        return torch.device("cuda", 0)


def test_strided_blocks_are_one_2d_copy_with_each_sides_pitch(monkeypatch):
    seen = _record(monkeypatch)
    table = torch.zeros(256, 512, dtype=torch.int32).as_subclass(_OnGpu)  # the graph's page table
    host = torch.arange(32 * 40, dtype=torch.int32).view(32, 40)  # a load's [bs, used width]
    transfer.copy_async(table[:32, :40], host)
    scalars = torch.zeros(9, 256, dtype=torch.int64).as_subclass(_OnGpu)
    twin = torch.zeros(9, 256, dtype=torch.int64)
    transfer.copy_async(scalars[:, :1], twin[:, :1])  # batch 1: nine rows of one element
    assert seen[0] == dict(
        src=host.data_ptr(), src_pitch=160, dst=table.data_ptr(), dst_pitch=2048, width=160, height=32,
        stream=0x5, kinds=(driver._UNIFIED, driver._UNIFIED),
    )  # fmt: skip
    assert (seen[1]["height"], seen[1]["width"], seen[1]["src_pitch"], seen[1]["dst_pitch"]) == (
        9,
        8,
        2048,
        2048,
    )


def test_one_row_and_contiguous_tensors_are_one_run(monkeypatch):
    seen = _record(monkeypatch)
    table = torch.zeros(256, 512, dtype=torch.int32).as_subclass(_OnGpu)
    transfer.copy_async(table[:1, :7], torch.ones(1, 7, dtype=torch.int32))
    transfer.copy_async(torch.zeros(3, 4, 5).as_subclass(_OnGpu), torch.ones(3, 4, 5))
    assert [(s["height"], s["width"]) for s in seen] == [(1, 28), (1, 240)]


def test_mismatches_and_other_layouts_are_refused(monkeypatch):
    _record(monkeypatch)
    dev = torch.zeros(4, 4).as_subclass(_OnGpu)
    with pytest.raises(ValueError, match="into"):
        transfer.copy_async(dev, torch.zeros(4, 5))
    with pytest.raises(ValueError, match="rows of contiguous"):
        transfer.copy_async(dev, torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="rows of contiguous"):
        transfer.copy_async(torch.zeros(2, 4, 4).as_subclass(_OnGpu)[:, :2], torch.zeros(2, 2, 4))


def test_corner_copies_hand_the_driver_what_copy_async_of_the_slices_does(monkeypatch):
    """The decode graphs' loads send corners through CornerCopy (pointers read once): the same driver
    call as `copy_async` of the two sliced corners, for the page table's [bs, width] and the scalars'
    [9, bs]."""
    seen = _record(monkeypatch)
    table = torch.zeros(256, 512, dtype=torch.int32).as_subclass(_OnGpu)
    host = torch.arange(256 * 512, dtype=torch.int32).view(256, 512)
    scalars, twin = (
        torch.zeros(9, 256, dtype=torch.int64).as_subclass(_OnGpu),
        torch.zeros(9, 256, dtype=torch.int64),
    )
    send_table, send_scalars = transfer.CornerCopy(table, host), transfer.CornerCopy(scalars, twin)
    for bs, width in ((1, 1), (1, 7), (32, 40), (256, 512)):
        send_table(bs, width)
        transfer.copy_async(table[:bs, :width], host[:bs, :width])
        send_scalars(9, bs)
        transfer.copy_async(scalars[:, :bs], twin[:, :bs])
    for call in seen:  # a one-row copy's pitches are never read (copy_async names the row's length)
        if call["height"] == 1:
            call["src_pitch"] = call["dst_pitch"] = None
    assert seen[0::2] == seen[1::2] and len(seen) == 16
    send_table(0, 5)  # an empty corner queues nothing
    assert len(seen) == 16


def test_corner_copies_refuse_other_layouts_and_oversized_corners():
    dev = torch.zeros(4, 6).as_subclass(_OnGpu)
    with pytest.raises(ValueError, match="one dtype"):
        transfer.CornerCopy(dev, torch.zeros(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous rows"):
        transfer.CornerCopy(dev, torch.zeros(6, 4).t())
    copy = transfer.CornerCopy(dev, torch.zeros(3, 8))  # the corner both hold: [3, 6]
    with pytest.raises(ValueError, match=r"\[4, 2\] corner of \[3, 6\]"):
        copy(4, 2)


def test_driver_errors_raise(monkeypatch):
    from sgjit.errors import KernelError

    spec = driver._Memcpy2D()
    monkeypatch.setattr(driver, "_memcpy_2d", lambda: (lambda *a: 700, spec))
    with pytest.raises(KernelError, match="CUresult 700"):
        driver.memcpy_2d_async(1, 8, 2, 8, 8, 1, 0)


def test_cpu_copies_and_readback_are_plain_copies():
    dst, src = torch.zeros(3, 8)[:, :4], torch.arange(12.0).view(3, 4)
    transfer.copy_async(dst, src)
    assert torch.equal(dst, src)
    whole = torch.zeros(3, 8)
    transfer.CornerCopy(whole, torch.ones(5, 5))(2, 3)
    assert whole.sum() == 6 and whole[:2, :3].eq(1).all()
    source = torch.arange(6)
    back = transfer.Readback([source], transfer.PinnedBuffers())
    source.zero_()  # the launch after overwrites the cells: the read-back holds its own copy
    assert back.wait()[0].tolist() == [0, 1, 2, 3, 4, 5]
    back.release()
