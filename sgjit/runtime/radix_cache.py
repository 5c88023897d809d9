"""Radix prefix cache over token ids at page granularity: each node is one full page of tokens, so a
node's key is that page's token tuple and its value the page id. The tree holds one page reference
per node; a node is evictable when it is a leaf and nothing but the tree references its page
(refcount 1: a running request, a held program prefix or a compiled plan holds another). Only full pages are shared, and full pages are never written again, so sharing
needs no copy-on-write."""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from sgjit.runtime.kv_pool import PageAllocator


@dataclass(eq=False, slots=True)
class RadixNode:
    key: tuple[int, ...]
    page: int
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    last_access: float = 0.0


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int, enabled: bool = True) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.root = RadixNode(key=(), page=-1, parent=None)
        self.num_nodes = 0
        self._tick = itertools.count()

    def _chunks(self, tokens: list[int], num_pages: int) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(num_pages)]

    def match(self, tokens: list[int], max_tokens: int | None = None) -> tuple[list[RadixNode], list[int]]:
        """Longest cached prefix of `tokens` (at most `max_tokens`), as nodes and their pages. The caller
        takes its own references on the pages it uses."""
        if not self.enabled:
            return [], []
        limit = len(tokens) if max_tokens is None else min(max_tokens, len(tokens))
        node, nodes = self.root, []
        now = time.monotonic()
        for key in self._chunks(tokens, limit // self.page_size):
            child = node.children.get(key)
            if child is None:
                break
            child.last_access = now
            nodes.append(child)
            node = child
        return nodes, [n.page for n in nodes]

    def insert(self, tokens: list[int], pages: list[int]) -> list[RadixNode]:
        """Record the full pages of a computed sequence. Where the tree already has a page for the same
        tokens, the tree's page stays (the caller's duplicate is freed when the caller lets go)."""
        if not self.enabled:
            return []
        node, path = self.root, []
        now = time.monotonic()
        for key, page in zip(self._chunks(tokens, len(tokens) // self.page_size), pages):
            child = node.children.get(key)
            if child is None:
                child = RadixNode(key=key, page=page, parent=node)
                node.children[key] = child
                self.allocator.incref([page])
                self.num_nodes += 1
            child.last_access = now
            path.append(child)
            node = child
        return path

    def _evictable(self, node: RadixNode) -> bool:
        return not node.children and self.allocator.refcount[node.page] == 1

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` pages, least recently used leaves first. Returns pages freed."""
        heap = [(n.last_access, next(self._tick), n) for n in self._leaves() if self._evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, node = heapq.heappop(heap)
            if not self._evictable(node):
                continue
            parent = node.parent
            self._remove(node)
            freed += 1
            if parent is not None and parent is not self.root and self._evictable(parent):
                heapq.heappush(heap, (parent.last_access, next(self._tick), parent))
        return freed

    def flush(self) -> int:
        """Drop every entry nothing but the tree references."""
        return self.evict(self.num_nodes)

    def _remove(self, node: RadixNode) -> None:
        assert node.parent is not None
        del node.parent.children[node.key]
        self.allocator.decref([node.page])
        self.num_nodes -= 1

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                out.append(n)
        return out

    def evictable_pages(self) -> int:
        """Pages an eviction could free now: nodes whose whole subtree is referenced by the tree alone."""
        order, stack = [], [self.root]
        while stack:  # iterative: a long sequence is a deep path
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        free_subtree: dict[int, bool] = {}
        count = 0
        for n in reversed(order):  # children before parents
            ok = all(free_subtree[id(c)] for c in n.children.values())
            if n is not self.root:
                ok = ok and self.allocator.refcount[n.page] == 1
                count += int(ok)
            free_subtree[id(n)] = ok
        return count
