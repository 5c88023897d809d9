"""The CUDA sources of the kernel families, as the compilers see them. `common.cuh` is inlined into
each family's text so the source string alone determines the binary: CuPy's disk cache keys on
that string, and a header edit then recompiles every family that includes it."""

from __future__ import annotations

import functools
from pathlib import Path

import xxhash

KERNEL_DIR = Path(__file__).resolve().parent
FAMILIES = ("norm", "activation", "rope", "attention", "attention_sm90", "decode", "sampling", "gemv")
_INCLUDE = '#include "common.cuh"'

# C++ spellings of the dtypes the templates take.
CPP_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "fp8_e4m3": "__nv_fp8_e4m3"}


@functools.cache
def family_source(family: str) -> str:
    """The compilable text of `<family>.cu` with the shared header inlined."""
    if family not in FAMILIES:
        raise KeyError(f"unknown kernel family {family!r}; known: {FAMILIES}")
    text = (KERNEL_DIR / f"{family}.cu").read_text()
    header = (KERNEL_DIR / "common.cuh").read_text().replace("#pragma once\n", "")
    return text.replace(_INCLUDE, header, 1)


def sources_digest() -> str:
    """xxhash64 over every family's compilable text: part of the arch hash, so a kernel edit
    invalidates compiled plans and stored autotuning results."""
    h = xxhash.xxh64()
    for family in FAMILIES:
        h.update(family.encode())
        h.update(family_source(family).encode())
    return h.hexdigest()
