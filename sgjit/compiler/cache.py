"""`JitCache`: compiled plans keyed by (plan_hash, arch_hash), least recently used first out. Evicting
or invalidating a plan calls its `release()` (which unpins its constant prefix in the KV cache)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol


class Releasable(Protocol):
    def release(self) -> None: ...


@dataclass(slots=True)
class JitCounters:
    jit_compiles: int = 0
    jit_cache_hits: int = 0
    jit_compile_ms_total: float = 0.0
    jit_evictions: int = 0


class JitCache:
    def __init__(self, limit: int = 64) -> None:
        if limit < 1:
            raise ValueError("jit_cache_limit must be >= 1")
        self.limit = limit
        self.counters = JitCounters()
        self._entries: OrderedDict[tuple[str, str], Releasable] = OrderedDict()
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._entries

    def get(self, key: tuple[str, str]) -> Releasable | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.counters.jit_cache_hits += 1
            return entry

    def put(self, key: tuple[str, str], entry: Releasable, compile_ms: float) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None and old is not entry:
                old.release()
            self._entries[key] = entry
            self.counters.jit_compiles += 1
            self.counters.jit_compile_ms_total += compile_ms
            while len(self._entries) > self.limit:
                _, evicted = self._entries.popitem(last=False)
                self.counters.jit_evictions += 1
                evicted.release()

    def invalidate(self, plan_hash: str) -> int:
        """Drop every entry of a plan (all arches); returns how many."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == plan_hash]
            for k in keys:
                self._entries.pop(k).release()
            return len(keys)

    def clear(self) -> int:
        with self._lock:
            n = len(self._entries)
            while self._entries:
                self._entries.popitem(last=False)[1].release()
            return n

    def keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._entries)
