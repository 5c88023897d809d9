"""Tensor maps (CUtensorMap) for the Hopper prefill kernel's TMA producer: one 5-D map per K and per
V pool, built once by the driver's cuTensorMapEncodeTiled (through ctypes: CuPy does not wrap it)
and stored in device memory, where the kernel names it by address.

The pool is one contiguous tensor [layers, pages, page_size, kv_heads, head_dim] and each layer's
K (V) is a view of it, so a map over the whole allocation serves every layer (the kernel takes the
layer index as a coordinate) and the pool never moves: a map built once stays valid, also inside a
captured CUDA graph. A box is (64 columns = 128 bytes, one head, `box_rows` slots, one page, one
layer), swizzled by 128 bytes: box_rows rows of 128 bytes in the layout attention_sm90.cu's tiles
use. Where pages are smaller than a tile, a second map per pool reads (page, slot) as one slot
dimension (`run_map`): a tile whose pages are consecutive ids then loads as one box a 64-column
block instead of one a page (TMA's cost is per box: 16 boxes of 2 KB a 32 KB tile at page 16)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from sgjit.errors import KernelError

# cuda.h's enums (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion, ...FloatOOBfill)
DATA_TYPE_UINT16 = 1  # a copy moves bits: one map type serves bf16 and fp16 pools
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2  # a box row: 128 bytes
OOB_FILL_NONE = 0  # zeros (the kernel's coordinates never leave the pool)
MAP_BYTES = 128  # sizeof(CUtensorMap)
MAP_ALIGN = 128  # cuda.h aligns it to 128 (the driver asks 64)
BOX_COLS = 64  # 128 bytes of 16-bit values: the widest box the 128-byte swizzle takes


@dataclass(frozen=True, slots=True)
class TiledMap:
    """cuTensorMapEncodeTiled's arguments but the address, dimensions innermost first."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, of dimensions 1.. (dimension 0 is dense)
    box: tuple[int, ...]
    data_type: int = DATA_TYPE_UINT16
    swizzle: int = SWIZZLE_128B
    l2_promotion: int = L2_PROMOTION_128B
    oob_fill: int = OOB_FILL_NONE
    interleave: int = INTERLEAVE_NONE

    @property
    def rank(self) -> int:
        return len(self.dims)


def _check_columns(element_size: int, head_dim: int) -> None:
    if element_size != 2 or head_dim % BOX_COLS:
        raise ValueError(
            f"TMA boxes of 64 16-bit columns: not {element_size}-byte values, head_dim {head_dim}"
        )


def pool_map(layer_shape: tuple[int, ...], num_layers: int, element_size: int, box_rows: int) -> TiledMap:
    """The map over a pool of `num_layers` layers of `layer_shape` = (pages, page_size, kv_heads,
    head_dim), boxes of `box_rows` slots of one head's 64-column block (coordinates: column, head,
    slot, page, layer). Raises ValueError for a pool the hardware cannot map this way."""
    pages, page_size, heads, head_dim = layer_shape
    _check_columns(element_size, head_dim)
    if not (0 < box_rows <= min(page_size, 256)) or box_rows % 8:
        raise ValueError(
            f"a box of {box_rows} rows: needs whole 8-row swizzle atoms within a page of {page_size}"
        )
    dims = (head_dim, heads, page_size, pages, num_layers)
    strides, stride = [], element_size
    for d in dims[:-1]:
        stride *= d
        strides.append(stride)
    if any(s >= 1 << 40 for s in strides) or any(d > 1 << 32 for d in dims):
        raise ValueError(f"pool {dims} past the tensor map's limits")
    return TiledMap(dims, tuple(strides), (BOX_COLS, 1, box_rows, 1, 1))


def run_map(layer_shape: tuple[int, ...], num_layers: int, element_size: int, box_rows: int) -> TiledMap:
    """The map over the same pool with pages and their slots as one dimension (coordinates: column,
    head, page * page_size + slot, layer): a box of `box_rows` slots spans consecutive pages."""
    pages, page_size, heads, head_dim = layer_shape
    _check_columns(element_size, head_dim)
    if not (0 < box_rows <= 256) or box_rows % 8:
        raise ValueError(f"a box of {box_rows} rows: whole 8-row swizzle atoms, at most 256")
    slot_bytes = heads * head_dim * element_size
    dims = (head_dim, heads, pages * page_size, num_layers)
    strides = (head_dim * element_size, slot_bytes, slot_bytes * pages * page_size)
    if strides[-1] >= 1 << 40 or dims[2] > 1 << 32:
        raise ValueError(f"pool {dims} past the tensor map's limits")
    return TiledMap(dims, strides, (BOX_COLS, 1, box_rows, 1))


def layer_of(t: torch.Tensor) -> tuple[int, int, int]:
    """(base address, layers, this tensor's layer) of a layer view into a pool: the allocation it
    lives in, read as whole layers of its shape. A tensor that is not a whole layer of its
    allocation (a test's standalone pool) is a pool of one layer itself."""
    layer = t.numel()
    storage = t.untyped_storage()
    total = storage.nbytes() // t.element_size()
    if t.is_contiguous() and t.storage_offset() % layer == 0 and total % layer == 0:
        return storage.data_ptr(), total // layer, t.storage_offset() // layer
    return t.data_ptr(), 1, 0


_encode = None


def _driver_encode():
    """cuTensorMapEncodeTiled from the driver library torch already loaded."""
    global _encode
    if _encode is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise KernelError(f"TMA tensor maps need the CUDA driver (libcuda.so.1): {e}") from e
        fn = lib.cuTensorMapEncodeTiled
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]  # fmt: skip
        fn.restype = ctypes.c_int
        _encode = fn
    return _encode


def encode(m: TiledMap, address: int) -> bytes:
    """The 128-byte CUtensorMap of `m` over device memory at `address`."""
    if address % 16:
        raise KernelError(f"a tensor map's base must be 16-byte aligned, not {address:#x}")
    raw = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
    at = -ctypes.addressof(raw) % MAP_ALIGN
    rank = m.rank
    rc = _driver_encode()(
        ctypes.addressof(raw) + at, m.data_type, rank, address,
        (ctypes.c_uint64 * rank)(*m.dims), (ctypes.c_uint64 * (rank - 1))(*m.strides),
        (ctypes.c_uint32 * rank)(*m.box), (ctypes.c_uint32 * rank)(*([1] * rank)),
        m.interleave, m.swizzle, m.l2_promotion, m.oob_fill,
    )  # fmt: skip
    if rc != 0:
        raise KernelError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for {m}; check the pool's shape")
    return raw.raw[at : at + MAP_BYTES]


class PoolMaps:
    """Device copies of the K and V maps (K's at offset 0, V's at MAP_BYTES) of each pool seen, by
    base address and shape, and with `run_rows`, the K and V run maps after them (offsets 2 and 3 x
    MAP_BYTES): built on a pool's first launch, before any kernel reads them."""

    def __init__(self, box_rows: int, run_rows: int | None = None) -> None:
        self.box_rows, self.run_rows = box_rows, run_rows
        self._maps: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (device, pinned host)

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(the maps' device buffer, the layer index) for one layer's K and V views."""
        (k_base, k_layers, k_layer), (v_base, v_layers, v_layer) = layer_of(k), layer_of(v)
        if k_layer != v_layer or k.shape != v.shape or k.dtype != v.dtype:
            raise KernelError("K and V must be the same layer of two pools of one shape for the TMA producer")
        key = (k_base, k_layers, v_base, v_layers, tuple(k.shape), k.dtype)
        if key not in self._maps:
            shape = tuple(k.shape)
            kinds = [(pool_map, self.box_rows)] + (
                [(run_map, self.run_rows)] if self.run_rows is not None else []
            )
            maps = [encode(build(shape, n, t.element_size(), rows), base)
                    for build, rows in kinds for t, base, n in ((k, k_base, k_layers), (v, v_base, v_layers))]  # fmt: skip
            host = torch.frombuffer(bytearray(b"".join(maps)), dtype=torch.uint8).pin_memory()
            # queued on the current stream ahead of the launch that reads it; no wait for a step in
            # flight (overlap scheduling), and the pinned source is kept with the buffer
            buf = host.to(k.device, non_blocking=True)
            if buf.data_ptr() % MAP_ALIGN:
                raise KernelError(f"tensor map buffer at {buf.data_ptr():#x} is not {MAP_ALIGN}-byte aligned")
            self._maps[key] = (buf, host)
        return self._maps[key][0], k_layer
