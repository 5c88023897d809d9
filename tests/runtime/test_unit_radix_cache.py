"""Unit tests of the radix prefix cache (sgjit/runtime/radix_cache.py) over a real `PageAllocator`:
page-granular matching, sharing on insert, LRU eviction of leaves, referenced pages never evicted."""

from __future__ import annotations

import types

import pytest

from sgjit.runtime import radix_cache
from sgjit.runtime.kv_pool import PageAllocator
from sgjit.runtime.radix_cache import RadixCache

PS = 4  # page size


class FakeClock:
    """A `time` stand-in whose monotonic clock only moves when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 1.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Replace the radix cache module's clock, so LRU order does not depend on timer resolution."""
    fake = FakeClock()
    monkeypatch.setattr(radix_cache, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


def _setup(num_pages: int = 16, enabled: bool = True) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages)
    return alloc, RadixCache(alloc, PS, enabled=enabled)


def _cache_seq(alloc: PageAllocator, cache: RadixCache, tokens: list[int]) -> list[int]:
    """What a finished request does: allocate its pages, insert its full pages, let go of its own refs.
    Returns the request's pages (the ones the tree took are held by the tree alone afterwards)."""
    pages = alloc.alloc(-(-len(tokens) // PS))
    assert pages is not None
    cache.insert(tokens, pages)
    alloc.decref(pages)
    return pages


def test_empty_cache_matches_nothing() -> None:
    """An empty tree has no nodes and matches no prefix."""
    _, cache = _setup()
    assert cache.num_nodes == 0
    assert cache.match(list(range(12))) == ([], [])


def test_match_whole_pages_only() -> None:
    """A sequence of 10 tokens caches its 2 full pages; the partial third page is never matched."""
    alloc, cache = _setup()
    toks = list(range(100, 110))
    pages = alloc.alloc(3)
    assert pages is not None
    path = cache.insert(toks, pages)
    assert [n.page for n in path] == pages[:2]
    assert cache.num_nodes == 2
    # the tree took one reference on each full page, none on the partial one
    assert alloc.refcount[pages].tolist() == [2, 2, 1]
    nodes, matched = cache.match(toks)
    assert matched == pages[:2]
    assert [n.key for n in nodes] == [tuple(toks[0:4]), tuple(toks[4:8])]
    # a longer query with the same prefix matches the same pages
    assert cache.match(toks + [1, 2, 3, 4, 5])[1] == pages[:2]
    # a query shorter than one page matches nothing
    assert cache.match(toks[:3])[1] == []


def test_match_takes_no_references() -> None:
    """match only reports pages; the caller takes its own references."""
    alloc, cache = _setup()
    toks = list(range(8))
    pages = _cache_seq(alloc, cache, toks)
    before = alloc.refcount.copy()
    assert cache.match(toks)[1] == pages
    assert (alloc.refcount == before).all()


@pytest.mark.parametrize(
    ("max_tokens", "num_pages"), [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (11, 2), (100, 3)]
)
def test_match_respects_max_tokens(max_tokens: int, num_pages: int) -> None:
    """max_tokens caps the match, rounded down to whole pages."""
    alloc, cache = _setup()
    toks = list(range(12))
    pages = _cache_seq(alloc, cache, toks)
    assert cache.match(toks, max_tokens=max_tokens)[1] == pages[:num_pages]


def test_match_stops_at_first_differing_page() -> None:
    """A single differing token in page 2 limits the match to page 1."""
    alloc, cache = _setup()
    toks = list(range(12))
    pages = _cache_seq(alloc, cache, toks)
    other = list(toks)
    other[5] = 999
    assert cache.match(other)[1] == pages[:1]
    other[0] = 999
    assert cache.match(other)[1] == []


def test_insert_shares_existing_nodes() -> None:
    """A second sequence with the same first page reuses the tree's node and page; its own duplicate
    page gets no tree reference, and only the new page becomes a node."""
    alloc, cache = _setup()
    a = list(range(8))
    b = a[:4] + [50, 51, 52, 53]
    pa = alloc.alloc(2)
    pb = alloc.alloc(2)
    assert pa is not None and pb is not None
    cache.insert(a, pa)
    path = cache.insert(b, pb)
    assert [n.page for n in path] == [pa[0], pb[1]]
    assert path[0] is cache.match(a)[0][0]
    assert cache.num_nodes == 3
    assert alloc.refcount[pb[0]] == 1  # the duplicate stays the caller's alone
    assert alloc.refcount[pb[1]] == 2
    assert cache.match(b)[1] == [pa[0], pb[1]]
    assert cache.match(a)[1] == pa
    # the caller lets go: its duplicate page is free again, the tree's pages are not
    alloc.decref(pa)
    alloc.decref(pb)
    assert alloc.refcount[pb[0]] == 0
    assert alloc.refcount[[pa[0], pa[1], pb[1]]].tolist() == [1, 1, 1]


def test_reinsert_same_sequence_adds_nothing() -> None:
    """Inserting a sequence the tree already has adds no node and no reference."""
    alloc, cache = _setup()
    toks = list(range(8))
    pages = _cache_seq(alloc, cache, toks)
    again = alloc.alloc(2)
    assert again is not None
    path = cache.insert(toks, again)
    assert [n.page for n in path] == pages
    assert cache.num_nodes == 2
    assert alloc.refcount[again].tolist() == [1, 1]


def test_insert_uses_only_pages_given() -> None:
    """With fewer pages than full token pages, only as many nodes as pages are recorded."""
    alloc, cache = _setup()
    pages = alloc.alloc(1)
    assert pages is not None
    path = cache.insert(list(range(12)), pages)
    assert len(path) == 1 and cache.num_nodes == 1


def test_evict_least_recently_used_leaf_first(clock: FakeClock) -> None:
    """Of three cached one-page sequences, eviction takes the least recently touched; a match counts
    as a touch."""
    alloc, cache = _setup()
    seqs = [[i] * PS for i in (1, 2, 3)]
    pages = []
    for s in seqs:
        pages += _cache_seq(alloc, cache, s)
        clock.tick()
    assert cache.match(seqs[0])[1] == [pages[0]]  # touch the oldest: it becomes the newest
    clock.tick()
    free0 = alloc.num_free
    assert cache.evict(1) == 1
    assert alloc.refcount[pages].tolist() == [1, 0, 1]
    assert alloc.num_free == free0 + 1
    assert cache.match(seqs[1])[1] == []
    assert cache.evict(1) == 1
    assert alloc.refcount[pages].tolist() == [1, 0, 0]
    assert cache.num_nodes == 1


def test_evict_walks_up_a_path(clock: FakeClock) -> None:
    """Evicting a leaf makes its parent a leaf, which can then go too; evict stops at the count asked."""
    alloc, cache = _setup()
    toks = list(range(12))
    pages = _cache_seq(alloc, cache, toks)
    assert cache.evict(1) == 1
    assert cache.match(toks)[1] == pages[:2]  # the deepest page went first
    assert alloc.refcount[pages].tolist() == [1, 1, 0]
    assert cache.evict(5) == 2
    assert cache.num_nodes == 0
    assert alloc.num_free == alloc.num_usable


def test_evict_prefers_old_branch_over_new(clock: FakeClock) -> None:
    """With a shared first page and two branches, the older branch's leaf goes first, and the shared
    parent stays while the newer branch still hangs off it."""
    alloc, cache = _setup()
    a = [0, 1, 2, 3, 10, 11, 12, 13]
    b = [0, 1, 2, 3, 20, 21, 22, 23]
    pa = _cache_seq(alloc, cache, a)
    clock.tick()
    pb = _cache_seq(alloc, cache, b)  # touches the shared page again
    clock.tick()
    assert cache.evict(1) == 1
    assert alloc.refcount[[pa[1], pb[1]]].tolist() == [0, 1]  # a's leaf went, b's stays
    assert cache.match(b)[1] == [pa[0], pb[1]]
    assert cache.evict(1) == 1
    assert alloc.refcount[pb[1]] == 0
    # what is left is the shared first page (the tree's copy, from a)
    assert cache.num_nodes == 1
    assert cache.match(b)[1] == [pa[0]]


def test_referenced_node_is_never_evicted(clock: FakeClock) -> None:
    """A leaf whose page someone else holds (refcount > 1) survives any eviction, and so does its
    parent, which never becomes a leaf."""
    alloc, cache = _setup()
    held = list(range(8))
    loose = [7] * PS
    held_pages = _cache_seq(alloc, cache, held)
    clock.tick()
    loose_pages = _cache_seq(alloc, cache, loose)
    alloc.incref(held_pages[1:])  # a running request holds the leaf
    assert cache.evict(10) == 1  # only the unreferenced sequence goes, although it is newer
    assert alloc.refcount[loose_pages].tolist() == [0]
    assert cache.num_nodes == 2
    assert cache.match(held)[1] == held_pages
    alloc.decref(held_pages[1:])
    assert cache.evict(10) == 2
    assert cache.num_nodes == 0


def test_referenced_inner_node_stays_when_its_child_goes(clock: FakeClock) -> None:
    """A held inner node is kept even after its unreferenced child is evicted."""
    alloc, cache = _setup()
    toks = list(range(8))
    pages = _cache_seq(alloc, cache, toks)
    alloc.incref(pages[:1])
    assert cache.evict(10) == 1
    assert cache.match(toks)[1] == pages[:1]
    assert alloc.refcount[pages].tolist() == [2, 0]


def test_evict_zero_frees_nothing() -> None:
    """evict(0) removes no node."""
    alloc, cache = _setup()
    _cache_seq(alloc, cache, list(range(8)))
    assert cache.evict(0) == 0
    assert cache.num_nodes == 2


def test_flush_drops_everything_unreferenced(clock: FakeClock) -> None:
    """flush frees every node only the tree holds and reports how many; held ones stay."""
    alloc, cache = _setup()
    for s in ([1] * 8, [2] * 4, [3] * 12):
        _cache_seq(alloc, cache, s)
        clock.tick()
    keep = cache.match([2] * 4)[1]
    alloc.incref(keep)
    assert cache.num_nodes == 6
    assert cache.flush() == 5
    assert cache.num_nodes == 1
    assert cache.match([2] * 4)[1] == keep
    alloc.decref(keep)
    assert cache.flush() == 1
    assert cache.num_nodes == 0
    assert alloc.num_free == alloc.num_usable


def test_evictable_pages_counts_free_subtrees() -> None:
    """evictable_pages counts nodes whose whole subtree only the tree holds, which is what flush then
    frees."""
    alloc, cache = _setup()
    base = [0, 1, 2, 3]
    x = base + [10] * 4 + [11] * 4  # root -> base -> x1 -> x2
    y = base + [20] * 4  # root -> base -> y1
    z = [9] * 8  # root -> z1 -> z2
    px = _cache_seq(alloc, cache, x)
    py = _cache_seq(alloc, cache, y)
    _cache_seq(alloc, cache, z)
    assert cache.num_nodes == 6
    assert cache.evictable_pages() == 6
    alloc.incref(py[1:2])  # y1 is held: base can no longer go either
    assert cache.evictable_pages() == 4  # x1, x2, z1, z2
    alloc.incref(px[1:2])  # x1 held (x2 below it is still free)
    assert cache.evictable_pages() == 3  # x2, z1, z2
    assert cache.flush() == 3
    assert cache.num_nodes == 3
    assert cache.evictable_pages() == 0
    alloc.decref(py[1:2] + px[1:2])
    assert cache.evictable_pages() == 3
    assert cache.flush() == 3
    assert alloc.num_free == alloc.num_usable


def test_num_nodes_tracks_inserts_and_evictions() -> None:
    """num_nodes is the number of cached pages at every point."""
    alloc, cache = _setup()
    _cache_seq(alloc, cache, list(range(16)))
    assert cache.num_nodes == 4
    _cache_seq(alloc, cache, list(range(8)) + [99] * 4)
    assert cache.num_nodes == 5
    cache.evict(2)
    assert cache.num_nodes == 3


def test_disabled_cache_records_and_matches_nothing() -> None:
    """With enabled=False, insert takes no references and match always misses."""
    alloc, cache = _setup(enabled=False)
    toks = list(range(8))
    pages = alloc.alloc(2)
    assert pages is not None
    assert cache.insert(toks, pages) == []
    assert alloc.refcount[pages].tolist() == [1, 1]
    assert cache.num_nodes == 0
    assert cache.match(toks) == ([], [])
    assert cache.evictable_pages() == 0
    assert cache.evict(4) == 0
    alloc.decref(pages)
    assert alloc.num_free == alloc.num_usable
