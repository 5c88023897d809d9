"""Unit tests of the continuous-batching scheduler (sgjit/runtime/scheduler.py) over a tiny CPU pool and
a real radix cache. No model runs: `_step` plays the engine's part (marks the scheduled tokens computed,
caches finished prompts and appends a made-up token to every sampling row)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
import torch

from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.request import Request, Status
from sgjit.runtime.sampling_params import SamplingParams
from sgjit.runtime.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from sgjit.runtime.tokenizer import IncrementalDetokenizer

PS = 4  # page size


class FakeTokenizer:
    """The one method the detokenizer calls; each id decodes to `<id>`."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)


_arrivals = itertools.count(1)
_sampled = itertools.count(10_000)


def _req(
    prompt: Sequence[int], max_new_tokens: int = 16, rid: str | None = None, protected: bool = False
) -> Request:
    """A request whose arrival order is the order of creation."""
    n = next(_arrivals)
    return Request(
        rid or f"r{n}",
        list(prompt),
        SamplingParams(max_new_tokens=max_new_tokens),
        IncrementalDetokenizer(FakeTokenizer()),  # type: ignore[arg-type]
        arrival=float(n),
        protected=protected,
    )


def _sched(
    num_pages: int = 17,
    chunk: int = 64,
    max_running: int = 256,
    policy: str = "fcfs",
    cache: bool = True,
    mixed: int | None = None,
) -> Scheduler:
    pool = PagedKVPool(2, num_pages, PS, 1, 8, torch.float32, torch.device("cpu"))
    config = SchedulerConfig(
        chunked_prefill_size=chunk, max_running_requests=max_running, policy=policy, mixed_step_tokens=mixed
    )
    return Scheduler(pool, RadixCache(pool.allocator, PS, enabled=cache), config)


def _step(s: Scheduler) -> ScheduledBatch | None:
    """Schedule one step and apply it the way the engine does after a forward pass."""
    batch = s.schedule()
    if batch is None:
        return None
    for row in batch.rows:
        req = row.req
        assert req.num_computed == row.start, "a row starts where its computed KV ends"
        assert len(req.pages) * PS >= row.end, "pages for every token of the row are reserved"
        req.num_computed = row.end
        if row.end - row.start > 1:  # a prefill chunk, cached as the engine does
            s.cache_computed(req)
        if row.sample:
            req.tokens.append(next(_sampled))
    return batch


def _spans(batch: ScheduledBatch | None) -> list[tuple[str, int, int, bool]]:
    assert batch is not None
    return [(r.req.rid, r.start, r.end, r.sample) for r in batch.rows]


def _finish(s: Scheduler, req: Request) -> None:
    s.remove(req)
    req.status = Status.FINISHED


def _check_refcounts(s: Scheduler) -> None:
    """Every page's refcount is what the running requests and the tree hold, and free pages are free."""
    rc = s.alloc.refcount
    held = [0] * s.alloc.num_pages
    held[0] = 1
    for r in s.running:
        for p in r.pages:
            held[p] += 1
    stack = list(s.cache.root.children.values())
    while stack:
        n = stack.pop()
        held[n.page] += 1
        stack.extend(n.children.values())
    assert rc.tolist() == held
    assert s.alloc.num_free == sum(1 for h in held if h == 0)


# ----- queue and basic steps -----


def test_empty_scheduler_has_no_batch() -> None:
    """Nothing queued: no work, no batch."""
    s = _sched()
    assert not s.has_work()
    assert s.schedule() is None


def test_short_prompt_is_prefilled_in_one_row_and_samples() -> None:
    """A prompt within the chunk budget runs whole in one row that samples, and the request is running
    with just enough pages."""
    s = _sched()
    r = _req(range(10), rid="a")
    s.add(r)
    assert s.has_work()
    batch = _step(s)
    assert _spans(batch) == [("a", 0, 10, True)]
    assert batch is not None and batch.num_tokens == 10
    assert r.status is Status.RUNNING and s.running == [r] and not s.waiting
    assert len(r.pages) == 3
    _check_refcounts(s)


def test_chunked_prefill_respects_chunk_size() -> None:
    """A 20-token prompt with chunked_prefill_size 8 runs as 8 + 8 + 4 tokens; only the last chunk
    samples; pages grow with the chunks."""
    s = _sched(chunk=8)
    r = _req(range(20), rid="a")
    s.add(r)
    pages = []
    spans = []
    for _ in range(3):
        spans += _spans(_step(s))
        pages.append(len(r.pages))
    assert spans == [("a", 0, 8, False), ("a", 8, 16, False), ("a", 16, 20, True)]
    assert pages == [2, 4, 5]
    assert _spans(_step(s)) == [("a", 20, 21, True)]  # then it decodes


def test_chunk_budget_is_shared_between_prefills() -> None:
    """Two 6-token prompts under an 8-token budget: the first runs whole, the second gets the 2 tokens
    left, and finishes its prompt in the next step."""
    s = _sched(chunk=8)
    a, b = _req(range(6), rid="a"), _req(range(50, 56), rid="b")
    s.add(a)
    s.add(b)
    batch = _step(s)
    assert _spans(batch) == [("a", 0, 6, True), ("b", 0, 2, False)]
    assert batch is not None and batch.num_tokens <= 8
    assert _spans(_step(s)) == [("a", 6, 7, True), ("b", 2, 6, True)]


def test_decode_rows_take_one_token_outside_the_budget() -> None:
    """Decoding rows each run exactly one token and do not use the prefill budget: a new prompt of the
    full budget size still runs whole alongside them."""
    s = _sched(chunk=8)
    a, b = _req(range(5), rid="a"), _req(range(20, 23), rid="b")
    s.add(a)
    s.add(b)
    _step(s)
    c = _req(range(40, 48), rid="c")
    s.add(c)
    assert _spans(_step(s)) == [("a", 5, 6, True), ("b", 3, 4, True), ("c", 0, 8, True)]
    for _ in range(3):
        assert all(end - start == 1 for _, start, end, _ in _spans(_step(s)))


def test_no_admission_once_the_budget_is_spent() -> None:
    """A prefill that uses the whole budget leaves nothing for a waiting request this step."""
    s = _sched(chunk=8)
    a, b = _req(range(8), rid="a"), _req(range(20, 23), rid="b")
    s.add(a)
    s.add(b)
    assert _spans(_step(s)) == [("a", 0, 8, True)]
    assert list(s.waiting) == [b]
    assert _spans(_step(s)) == [("a", 8, 9, True), ("b", 0, 3, True)]


def test_max_running_requests() -> None:
    """No more than max_running_requests run at once; a finished one makes room for the next."""
    s = _sched(max_running=2)
    reqs = [_req(range(i * 10, i * 10 + 3), rid=f"q{i}") for i in range(3)]
    for r in reqs:
        s.add(r)
    assert [row[0] for row in _spans(_step(s))] == ["q0", "q1"]
    assert [row[0] for row in _spans(_step(s))] == ["q0", "q1"]
    assert list(s.waiting) == [reqs[2]]
    _finish(s, reqs[0])
    assert [(rid, start) for rid, start, _, _ in _spans(_step(s))] == [("q1", 4), ("q2", 0)]
    assert len(s.running) == 2


def test_request_without_new_tokens_never_samples() -> None:
    """max_new_tokens=0: the prompt is computed but no row samples."""
    s = _sched(chunk=4)
    r = _req(range(6), max_new_tokens=0, rid="a")
    s.add(r)
    assert _spans(_step(s)) == [("a", 0, 4, False)]
    assert _spans(_step(s)) == [("a", 4, 6, False)]
    assert r.pending == 0
    assert s.schedule() is None  # nothing left to run (the engine finishes it)


# ----- prefix cache -----


def _cache_prefix(s: Scheduler, prompt: Sequence[int]) -> None:
    """Prefill a request over `prompt` and finish it, leaving its full pages in the cache."""
    r = _req(prompt, max_new_tokens=0)
    s.add(r)
    for _ in range(len(prompt)):
        if not r.pending:
            break
        assert _step(s) is not None
    assert r.pending == 0
    _finish(s, r)


def test_prefix_hit_sets_cached_tokens_and_shares_pages() -> None:
    """A prompt whose first 8 tokens are cached starts computing at 8, reports 8 cached tokens and
    holds the tree's pages (refcount 2)."""
    s = _sched()
    prefix = list(range(100, 108))
    _cache_prefix(s, prefix + [1, 2])
    tree_pages = s.cache.match(prefix)[1]
    assert len(tree_pages) == 2
    r = _req(prefix + [7, 7, 7, 7, 7], rid="hit")
    s.add(r)
    assert _spans(_step(s)) == [("hit", 8, 13, True)]
    assert r.cached_tokens == 8
    assert s.prefix_hit_tokens == 8
    assert r.pages[:2] == tree_pages
    assert s.alloc.refcount[tree_pages].tolist() == [2, 2]
    _check_refcounts(s)


def test_fully_cached_prompt_still_runs_one_token() -> None:
    """When the whole prompt is cached, the match stops short so at least one token runs: an 8-token
    prompt over 2 cached pages reuses only the first page."""
    s = _sched()
    prompt = list(range(200, 208))
    _cache_prefix(s, prompt)
    assert len(s.cache.match(prompt)[1]) == 2
    r = _req(prompt, rid="again")
    s.add(r)
    assert _spans(_step(s)) == [("again", 4, 8, True)]
    assert r.cached_tokens == 4


def test_miss_reports_no_cached_tokens() -> None:
    """A prompt with nothing cached reports 0 cached tokens."""
    s = _sched()
    _cache_prefix(s, list(range(8)))
    r = _req(range(50, 60))
    s.add(r)
    _step(s)
    assert r.cached_tokens == 0
    assert s.prefix_hit_tokens == 0


def test_disabled_cache_never_hits() -> None:
    """With the cache disabled, a repeated prompt is computed from position 0."""
    s = _sched(cache=False)
    prompt = list(range(12))
    _cache_prefix(s, prompt)
    assert s.alloc.num_free == s.alloc.num_usable
    r = _req(prompt, rid="b")
    s.add(r)
    assert _spans(_step(s)) == [("b", 0, 12, True)]
    assert r.cached_tokens == 0


@pytest.mark.parametrize(("policy", "first"), [("fcfs", "plain"), ("lpm", "hit")])
def test_policy_orders_waiting_requests(policy: str, first: str) -> None:
    """fcfs admits in arrival order; lpm admits the request with the longest cached prefix first."""
    s = _sched(max_running=1, policy=policy)
    prefix = list(range(300, 308))
    _cache_prefix(s, prefix + [0])
    plain = _req(range(400, 410), rid="plain")
    hit = _req(prefix + [9, 9], rid="hit")
    s.add(plain)
    s.add(hit)
    assert [row[0] for row in _spans(_step(s))] == [first]


def test_lpm_breaks_ties_by_arrival() -> None:
    """Under lpm, requests with equally long matches keep arrival order."""
    s = _sched(max_running=1, policy="lpm")
    a, b = _req(range(10), rid="a"), _req(range(20, 30), rid="b")
    s.add(a)
    s.add(b)
    assert [row[0] for row in _spans(_step(s))] == ["a"]


# ----- remove -----


def test_remove_releases_pages_and_caches_the_computed_prefix() -> None:
    """remove() takes the request out and drops its references; its computed full pages stay in the
    cache (refcount 1) and a flush frees them."""
    s = _sched()
    r = _req(range(10), rid="a")
    s.add(r)
    _step(s)  # 10 prompt tokens computed, one token sampled
    _step(s)  # 11 computed
    pages = list(r.pages)
    s.remove(r)
    assert r not in s.running and r.pages == []
    assert s.alloc.refcount[pages].tolist() == [1, 1, 0]
    assert s.cache.match(r.tokens)[1] == pages[:2]
    assert not s.has_work()
    _check_refcounts(s)
    assert s.cache.flush() == 2
    assert s.alloc.num_free == s.alloc.num_usable


def test_remove_waiting_request() -> None:
    """A request removed before it was admitted leaves the queue and holds nothing."""
    s = _sched()
    r = _req(range(5))
    s.add(r)
    s.remove(r)
    assert not s.waiting and not s.has_work()
    assert s.alloc.num_free == s.alloc.num_usable


# ----- memory pressure -----


@pytest.mark.parametrize(("prompt_len", "admitted"), [(4, True), (8, False)])
def test_admission_keeps_a_page_of_headroom_per_running_row(prompt_len: int, admitted: bool) -> None:
    """A request is admitted only if, after its pages, one free page is left per running request: with
    2 pages free and one request running, a 1-page prompt gets in and a 2-page prompt waits."""
    s = _sched(num_pages=5)  # 4 usable pages
    a = _req(range(7), rid="a")  # 2 pages
    s.add(a)
    _step(s)
    b = _req(range(50, 50 + prompt_len), rid="b")
    s.add(b)
    spans = _spans(_step(s))
    if admitted:
        assert spans == [("a", 7, 8, True), ("b", 0, prompt_len, True)]
        assert b.status is Status.RUNNING
    else:
        assert spans == [("a", 7, 8, True)]
        assert list(s.waiting) == [b] and b.status is Status.WAITING and b.pages == []
    _check_refcounts(s)


def test_cache_is_evicted_before_anything_is_preempted() -> None:
    """When a growing request finds the pool dry, unreferenced cache pages are evicted for it."""
    s = _sched(num_pages=5)  # 4 usable
    _cache_prefix(s, list(range(100, 108)))  # 2 cached pages, now only the tree's
    assert s.alloc.num_free == 2
    a = _req(range(8), rid="a")
    s.add(a)
    # admission needs 2 pages: the 2 free ones
    assert _spans(_step(s)) == [("a", 0, 8, True)]
    assert s.alloc.num_free == 0
    # decoding position 8 needs a third page: a cache page is evicted, nobody is preempted
    assert _spans(_step(s)) == [("a", 8, 9, True)]
    assert a.status is Status.RUNNING and a.preemptions == 0
    assert s.cache.num_nodes == 3  # a's own 2 pages + 1 of the old prefix
    _check_refcounts(s)


def test_a_full_pool_evicts_in_batches(monkeypatch) -> None:
    """An eviction walks the whole prefix tree, so a shortfall frees `evict_batch` pages at once and
    the next rows that cross a page find them free instead of walking the tree again."""
    s = _sched(num_pages=129, chunk=512)  # 128 usable pages: an eviction batch of 2
    assert s.evict_batch == 2
    for i in range(4):  # 4 x 32 cached pages fill the pool with pages only the tree holds
        _cache_prefix(s, list(range(1000 * (i + 1), 1000 * (i + 1) + 32 * PS)))
    assert s.alloc.num_free == 0
    walks = []
    evict = s.cache.evict
    monkeypatch.setattr(s.cache, "evict", lambda n: walks.append(n) or evict(n))
    assert s._ensure_free(1) and walks == [2] and s.alloc.num_free == 2
    taken = s.alloc.alloc(1)  # the page a row took
    assert s._ensure_free(1) and walks == [2]  # the next row finds its page without a walk
    s.alloc.decref(taken)
    _check_refcounts(s)


def test_preemption_takes_the_newest_request_and_keeps_its_tokens() -> None:
    """When a decode row cannot get a page, the most recently arrived request is preempted: it loses its
    pages, its computed full pages stay cached, it keeps prompt and output tokens and goes back to the
    front of the queue; later it resumes from the cached prefix and samples its next token."""
    s = _sched(num_pages=5)  # 4 usable pages
    a = _req(range(7), max_new_tokens=20, rid="a")
    s.add(a)
    _step(s)  # a: 2 pages
    b = _req(range(100, 104), max_new_tokens=20, rid="b")
    s.add(b)
    assert _spans(_step(s)) == [("a", 7, 8, True), ("b", 0, 4, True)]  # b: 1 page, 1 free
    b_tokens = list(b.tokens)
    assert len(b_tokens) == 5
    waiter = _req(range(900, 903), rid="w")
    s.add(waiter)
    # a takes the last free page for position 8; b then needs a page for position 4 and is the newest
    assert _spans(_step(s)) == [("a", 8, 9, True)]
    assert b.status is Status.WAITING and b.preemptions == 1
    assert b.pages == [] and b.num_computed == 0
    assert b.tokens == b_tokens  # prompt and sampled token kept
    assert list(s.waiting)[0] is b  # front of the queue, before the request that was already waiting
    assert s.running == [a]
    assert s.cache.match(b.tokens)[1] != []  # its computed page is in the cache
    _check_refcounts(s)
    # once a is done, b comes back from its cached page and samples right away
    _finish(s, a)
    assert _spans(_step(s)) == [("b", 4, 5, True), ("w", 0, 3, True)]
    assert b.cached_tokens == 0  # still what its first admission found, not the re-admission's hit
    assert b.status is Status.RUNNING and b.tokens[:5] == b_tokens
    _check_refcounts(s)


def test_preemption_spares_older_requests_in_the_same_step() -> None:
    """With three running requests and no page for the oldest, the newest is preempted first and the
    others keep running."""
    s = _sched(num_pages=7)  # 6 usable
    a = _req(range(3), max_new_tokens=50, rid="a")
    s.add(a)
    _step(s)
    b = _req(range(10, 13), max_new_tokens=50, rid="b")
    c = _req(range(20, 23), max_new_tokens=50, rid="c")
    s.add(b)
    s.add(c)
    _step(s)
    assert {r.rid for r in s.running} == {"a", "b", "c"}
    preempted: list[str] = []
    for _ in range(12):
        batch = _step(s)
        assert batch is not None
        preempted += [r.rid for r in (a, b, c) if r.status is Status.WAITING and r.rid not in preempted]
        if preempted:
            break
    assert preempted == ["c"]
    assert a.status is Status.RUNNING and b.status is Status.RUNNING
    _check_refcounts(s)


def test_protected_request_is_preempted_last() -> None:
    """A compiled program's step (protected) is not the victim while an unprotected request runs, even
    an older one."""
    s = _sched(num_pages=9)  # 8 usable
    u = _req(range(3), max_new_tokens=50, rid="u")
    s.add(u)
    _step(s)
    p = _req(range(10, 13), max_new_tokens=1, rid="p", protected=True)
    s.add(p)
    _step(s)
    assert s._preemption_victim() is u
    p.protected = False
    assert s._preemption_victim() is p  # otherwise the newest


def test_unprotected_request_borrows_pages_promised_to_a_protected_one() -> None:
    """A compiled program's step is promised its worst case, but the pages it has not taken yet are
    lent to an ordinary request (which runs at once instead of waiting for the program) and taken
    back by preempting the borrower when the program grows into them. The program is never
    preempted and both finish."""
    s = _sched(num_pages=9)  # 8 usable
    p = _req(range(3), max_new_tokens=25, rid="p", protected=True)  # worst case 28 tokens = 7 pages
    s.add(p)
    _step(s)
    u = _req(range(40, 43), max_new_tokens=8, rid="u")
    s.add(u)
    batch = _step(s)
    assert "u" in [rid for rid, *_ in _spans(batch)], "the borrower runs beside the program"
    for _ in range(200):
        if _step(s) is None:
            break
        for r in list(s.running):
            if r.num_output >= r.params.max_new_tokens:
                s.remove(r)
    assert p.preemptions == 0
    assert p.num_output == 25 and u.num_output == 8
    _check_refcounts(s)


# ----- schedule_decode_ahead -----


def _two_decoding(num_pages: int = 17) -> tuple[Scheduler, Request, Request]:
    s = _sched(num_pages=num_pages)
    a, b = _req(range(7), max_new_tokens=50, rid="a"), _req(range(20, 23), max_new_tokens=50, rid="b")
    s.add(a)
    s.add(b)
    _step(s)
    return s, a, b


def test_decode_ahead_reserves_pages_for_several_tokens() -> None:
    """Every running row decodes one token now, with pages reserved for `ahead(req)` tokens."""
    s, a, b = _two_decoding()
    assert (a.num_computed, b.num_computed) == (7, 3)
    batch = s.schedule_decode_ahead(lambda r: 6)
    assert _spans(batch) == [("a", 7, 8, True), ("b", 3, 4, True)]
    assert len(a.pages) == s.pool.pages_for(7 + 6) == 4
    assert len(b.pages) == s.pool.pages_for(3 + 6) == 3
    _check_refcounts(s)


def test_decode_ahead_declines_mixed_work() -> None:
    """It is a pure decode step: None while a request waits, while a row still prefills, with no
    running rows, or when a row wants no more tokens."""
    s = _sched()
    assert s.schedule_decode_ahead(lambda r: 4) is None  # nothing running
    s, a, b = _two_decoding()
    s.add(_req(range(5)))
    assert s.schedule_decode_ahead(lambda r: 4) is None  # someone waits
    s2 = _sched(chunk=4)
    s2.add(_req(range(10)))
    _step(s2)  # still prefilling
    assert s2.schedule_decode_ahead(lambda r: 4) is None
    s3 = _sched()
    done = _req(range(5), max_new_tokens=1)
    s3.add(done)
    _step(s3)  # sampled its only token: pending 1 but wants no more
    assert done.pending == 1 and not done.wants_tokens
    assert s3.schedule_decode_ahead(lambda r: 4) is None


def test_decode_ahead_never_preempts() -> None:
    """Without enough pages for the look-ahead it returns None and every row keeps running."""
    s, a, b = _two_decoding(num_pages=5)  # 4 usable: a has 2, b has 1
    assert s.schedule_decode_ahead(lambda r: 40) is None
    assert s.running == [a, b]
    assert a.status is Status.RUNNING and b.status is Status.RUNNING
    assert a.preemptions == 0 and b.preemptions == 0
    _check_refcounts(s)


def test_decode_ahead_evicts_cache_for_room() -> None:
    """Cache pages only the tree holds are evicted to make room for the look-ahead."""
    s = _sched(num_pages=7)  # 6 usable
    _cache_prefix(s, list(range(500, 512)))  # 3 pages in the cache
    a = _req(range(3), max_new_tokens=50, rid="a")
    s.add(a)
    _step(s)  # 1 page; 2 free
    assert s.alloc.num_free == 2
    batch = s.schedule_decode_ahead(lambda r: 13)  # 3 + 13 = 16 tokens: 4 pages, 3 more
    assert _spans(batch) == [("a", 3, 4, True)]
    assert len(a.pages) == 4
    assert s.cache.num_nodes == 2
    _check_refcounts(s)


# ----- in-batch prefix sharing -----


def test_requests_arriving_together_compute_a_shared_prefix_once() -> None:
    """Three requests share a 40-token prefix and arrive in one step, with an unrelated one between
    them: the first and the unrelated one run; the others wait one step and start from the first's
    cached pages (40 tokens = 10 pages), keeping their order."""
    s = _sched(num_pages=64, chunk=256)
    prefix = list(range(100, 140))
    a, x, b, c = (
        _req(prefix + [1, 2], rid="a"),
        _req(range(500, 520), rid="x"),
        _req(prefix + [3], rid="b"),
        _req(prefix + [4, 5, 6], rid="c"),
    )
    for r in (a, x, b, c):
        s.add(r)
    assert _spans(_step(s)) == [("a", 0, 42, True), ("x", 0, 20, True)]
    assert [r.rid for r in s.waiting] == ["b", "c"]
    assert _spans(_step(s)) == [
        ("a", 42, 43, True),
        ("x", 20, 21, True),
        ("b", 40, 41, True),
        ("c", 40, 43, True),
    ]
    assert b.cached_tokens == c.cached_tokens == 40
    assert b.pages[:10] == c.pages[:10] == a.pages[:10]
    _check_refcounts(s)


def test_a_request_waits_for_the_chunks_it_shares() -> None:
    """Under chunked prefill each chunk's pages are cached as they are computed: the waiting request
    is admitted once fewer than share_min_tokens shared tokens are still uncached."""
    s = _sched(num_pages=64, chunk=32)
    prefix = list(range(200, 280))
    a, b = _req(prefix, rid="a"), _req(prefix + [9, 9, 9, 9], rid="b")
    s.add(a)
    s.add(b)
    assert _spans(_step(s)) == [("a", 0, 32, False)]
    assert _spans(_step(s)) == [("a", 32, 64, False)]
    assert _spans(_step(s)) == [("a", 64, 80, True), ("b", 64, 80, False)]  # 16 left: not worth a wait
    assert b.cached_tokens == 64
    _check_refcounts(s)


def test_prefix_sharing_off() -> None:
    s = _sched(num_pages=64, chunk=256)
    s.config.share_min_tokens = 0
    prefix = list(range(100, 140))
    a, b = _req(prefix + [1], rid="a"), _req(prefix + [2], rid="b")
    s.add(a)
    s.add(b)
    assert _spans(_step(s)) == [("a", 0, 41, True), ("b", 0, 41, True)]
    assert b.cached_tokens == 0


def test_sharing_below_the_threshold_does_not_wait() -> None:
    """A common prefix shorter than share_min_tokens (32) is not worth a step's wait."""
    s = _sched(num_pages=64, chunk=256)
    prefix = list(range(100, 128))  # 28 tokens
    a, b = _req(prefix + [1], rid="a"), _req(prefix + [2], rid="b")
    s.add(a)
    s.add(b)
    assert _spans(_step(s)) == [("a", 0, 29, True), ("b", 0, 29, True)]


# ----- the step token budget and overlap scheduling -----


def test_a_step_with_decode_rows_stays_within_the_mixed_budget() -> None:
    """With 6 rows decoding and mixed_step_tokens 16, a long prompt gets 16 - 6 = 10 tokens a step;
    alone (nothing decoding) it gets the whole chunked_prefill_size."""
    s = _sched(num_pages=65, chunk=64, mixed=16)
    decoding = [_req(range(i * 10, i * 10 + 3), max_new_tokens=50) for i in range(6)]
    for r in decoding:
        s.add(r)
    _step(s)
    long = _req(range(100, 160), rid="long")
    s.add(long)
    batch = _step(s)
    assert _spans(batch)[-1] == ("long", 0, 10, False)
    assert batch is not None and batch.num_tokens == 16
    alone = _sched(num_pages=65, chunk=64, mixed=16)
    alone.add(_req(range(100, 160), rid="alone"))
    assert _spans(_step(alone)) == [("alone", 0, 60, True)]


def test_prompts_keep_a_quarter_of_the_budget_when_decode_rows_fill_it() -> None:
    s = _sched(num_pages=129, chunk=64, mixed=16)
    for i in range(20):  # 20 decode rows > 16
        s.add(_req(range(i * 5, i * 5 + 2), max_new_tokens=50))
    _step(s)
    s.add(_req(range(200, 240), rid="p"))
    assert _spans(_step(s))[-1] == ("p", 0, 4, False)  # 16 // 4


def test_a_row_whose_last_token_is_drawn_sits_out() -> None:
    """Overlap scheduling: a row that has drawn its last token (a placeholder the engine has not read
    back yet) takes no more steps, single or multi-step; the others go on. Its placeholder never
    reaches the prefix cache."""
    s = _sched()
    a, b = _req(range(7), max_new_tokens=1, rid="a"), _req(range(20, 23), max_new_tokens=9, rid="b")
    s.add(a)
    s.add(b)
    s.schedule()
    for req in (a, b):  # the launch's bookkeeping: KV computed, a placeholder for the drawn token
        req.num_computed = len(req.tokens)
        req.tokens.append(-1)
    assert a.pending == 1 and not a.wants_tokens
    assert _spans(s.schedule()) == [("b", 3, 4, True)]
    assert _spans(s.schedule_decode_ahead(lambda r: 4)) == [("b", 3, 4, True)]
    a.num_computed = 8  # as if the placeholder's KV were computed: it would fill the second page
    s.cache_computed(a)
    assert s.cache.num_nodes == 1  # only the page of real tokens


def test_a_row_that_drew_the_last_token_the_context_allows_sits_out() -> None:
    """A row whose drawn (not yet read back) token fills the context takes no more steps, though it
    still wants tokens, and does not count against the prompts' share of a mixed step."""
    s = _sched(num_pages=65, chunk=64, mixed=16)
    s.config.max_model_len = 48
    a = _req(range(47), max_new_tokens=50, rid="a")
    s.add(a)
    s.schedule()
    a.num_computed = 47
    a.tokens.append(-1)  # the placeholder of its 48th token, the last the context allows
    assert a.wants_tokens and a.pending == 1
    long = _req(range(100, 140), rid="long")
    s.add(long)
    assert _spans(s.schedule()) == [("long", 0, 40, True)]  # a sits out; the prompt is not cut to 16
    long.num_computed = 40
    long.tokens.append(-2)
    assert _spans(s.schedule_decode_ahead(lambda r: 4)) == [("long", 40, 41, True)]


@pytest.mark.parametrize("seed", range(40))
def test_decode_ahead_grows_rows_as_one_by_one(seed: int) -> None:
    """`schedule_decode_ahead` reserves exactly what growing its rows one by one reserves (the same
    pages to the same rows, the same cache evicted, the same answer), whether the free pages cover
    every row at once or not, with protected rows among them."""

    def build() -> tuple[Scheduler, list[Request]]:
        rng = random.Random(seed)
        s = _sched(num_pages=rng.randint(10, 30))
        _cache_prefix(s, [rng.randrange(1000, 2000) for _ in range(rng.choice([0, 4, 8, 12]))])
        reqs = [
            _req(
                [rng.randrange(100) for _ in range(rng.randint(1, 9))],
                max_new_tokens=rng.randint(4, 30),
                rid=f"r{i}",
                protected=rng.random() < 0.4,
            )
            for i in range(rng.randint(1, 5))
        ]
        for r in reqs:
            s.add(r)
        while s.waiting or any(r.pending > 1 for r in reqs):
            if _step(s) is None:
                break
        return s, reqs

    rng = random.Random(seed + 1000)
    ahead = {f"r{i}": rng.randint(1, 16) for i in range(5)}
    fast, fast_reqs = build()
    slow, slow_reqs = build()
    slow._grow_ahead = slow._grow_each  # type: ignore[method-assign]
    got = fast.schedule_decode_ahead(lambda r: ahead[r.rid])
    want = slow.schedule_decode_ahead(lambda r: ahead[r.rid])
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert _spans(got) == _spans(want) and got.ahead == want.ahead
    assert [r.pages for r in fast_reqs] == [r.pages for r in slow_reqs]
    assert fast.alloc._free == slow.alloc._free
    assert fast.alloc.refcount.tolist() == slow.alloc.refcount.tolist()
    assert fast.cache.num_nodes == slow.cache.num_nodes
    _check_refcounts(fast)
