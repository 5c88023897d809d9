"""The CUDA sources of the kernel families, as the compilers see them. The headers a family includes
(`common.cuh`, `gemv.cuh`, and theirs) are inlined into its text, each once, so the source string
alone determines the binary: CuPy's disk cache keys on that string, and a header edit then
recompiles every family that includes it."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import xxhash

KERNEL_DIR = Path(__file__).resolve().parent
FAMILIES = (
    "norm", "activation", "rope", "attention", "attention_sm90", "decode", "lean_decode", "sampling", "gemv",
    "megakernel",
    "fp8_quant",
)  # fmt: skip
_INCLUDE = re.compile(r'^#include "(\w+\.cuh)"\n', re.MULTILINE)

# C++ spellings of the dtypes the templates take.
CPP_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "fp8_e4m3": "__nv_fp8_e4m3"}


@functools.cache
def family_source(family: str) -> str:
    """The compilable text of `<family>.cu` with the headers it includes inlined."""
    if family not in FAMILIES:
        raise KeyError(f"unknown kernel family {family!r}; known: {FAMILIES}")
    return _inline((KERNEL_DIR / f"{family}.cu").read_text(), set())


def _inline(text: str, seen: set[str]) -> str:
    """`text` with each `#include "x.cuh"` replaced by the header's text, inlined the same way; a
    header already inlined (the `#pragma once` of the files) becomes nothing."""

    def header(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _inline((KERNEL_DIR / name).read_text().replace("#pragma once\n", ""), seen)

    return _INCLUDE.sub(header, text)


def sources_digest() -> str:
    """xxhash64 over every family's compilable text: part of the arch hash, so a kernel edit
    invalidates compiled plans and stored autotuning results."""
    h = xxhash.xxh64()
    for family in FAMILIES:
        h.update(family.encode())
        h.update(family_source(family).encode())
    return h.hexdigest()
