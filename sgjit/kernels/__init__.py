"""Ops of the model: the table (`ops`), the torch reference (`reference`), CPU variants (`cpu`) and
the CUDA kernels (`*.cu` + `cuda/`), chosen by `sgjit.compiler.select` and assembled by
`build_ops`. Importing this package needs neither CuPy nor a GPU."""

from __future__ import annotations

from typing import Any


def build_ops(*args: Any, **kwargs: Any) -> Any:
    """`sgjit.kernels.table.build_ops` (imported on first use: it pulls in the compiler)."""
    from sgjit.kernels.table import build_ops as _build_ops

    return _build_ops(*args, **kwargs)
