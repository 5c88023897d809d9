"""`GuardedOp`: a kernel op that falls back to its reference op for good after its first failure,
with one warning naming the kernel, so serving goes on on torch for that op alone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class GuardedOp:
    def __init__(self, op: str, kernel: str, fn: Callable[..., Any], fallback: Callable[..., Any]) -> None:
        self.op = op
        self.kernel = kernel
        self.fn = fn
        self.fallback = fallback
        self.failed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            return self.fallback(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as e:  # any launch error: the reference op recomputes everything
            self.failed = True
            log.warning(
                "kernel %s (op %s) failed at launch: %s; op %s now uses the torch reference",
                self.kernel,
                self.op,
                e,
                self.op,
            )
            return self.fallback(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """The kernel op's own attributes show through while it serves (e.g.
        `PagedAttention.decode_launch`, which CUDA-graph bucketing asks); none once it fell back."""
        state = self.__dict__
        if name.startswith("_") or "fn" not in state or state.get("failed", True):
            raise AttributeError(name)
        return getattr(state["fn"], name)

    def __repr__(self) -> str:
        return f"GuardedOp({self.op}: {self.kernel}{', fell back' if self.failed else ''})"
