"""Continuous batching over the paged pool: every step carries one token for each decoding row plus
prefill chunks of rows still reading their prompt, in one forward pass. A step with decode rows
stays within `mixed_step_tokens` (decode rows included), so a long prompt is cut into chunks that
do not stall the rows that are decoding; a step of prompts alone takes up to `chunked_prefill_size`
tokens. New requests join at any step; finished ones leave at once. When the pool runs dry,
the prefix cache is evicted first and then the most recently admitted request is preempted: its
pages are freed (its computed prefix left in the cache) and it is recomputed later, keeping the
tokens it already produced.

Requests that arrive together with a common prefix compute it once: a waiting request whose prompt
shares more than the cache holds with a row still reading its prompt waits until that row's
chunks are computed (each prefill chunk's full pages enter the prefix cache), then starts from the
cached pages."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sgjit.runtime.kv_pool import PagedKVPool
from sgjit.runtime.radix_cache import RadixCache
from sgjit.runtime.request import Request, Status

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SchedulerConfig:
    chunked_prefill_size: int = 2048
    max_running_requests: int = 256
    policy: str = "fcfs"  # "fcfs" | "lpm" (longest prefix match first)
    # Tokens of a step that carries decode rows: its decode rows (one token each) and prefill chunks
    # together, but never fewer than a quarter of it for the prompts, so prefill keeps moving when
    # decode rows alone fill it. None: prompts get chunked_prefill_size whatever decodes beside them.
    mixed_step_tokens: int | None = 1024
    max_model_len: int = 1 << 62  # a row at this length draws no more tokens
    # A waiting request sharing at least this many uncached prompt tokens with a row still prefilling
    # waits for that row's pages; 0 turns in-batch prefix sharing off.
    share_min_tokens: int = 32
    share_scan_limit: int = 64  # waiting requests passed over per step, at most (bounds the scan)


@dataclass(slots=True)
class RowChunk:
    req: Request
    start: int  # first position computed this step
    end: int  # one past the last
    sample: bool  # the row draws its next token after this step


@dataclass(slots=True)
class ScheduledBatch:
    rows: list[RowChunk]
    ahead: list[int] = field(default_factory=list)  # decode-ahead: tokens each row's pages are reserved for

    @property
    def num_tokens(self) -> int:
        return sum(r.end - r.start for r in self.rows)


class Scheduler:
    def __init__(self, pool: PagedKVPool, cache: RadixCache, config: SchedulerConfig) -> None:
        self.pool = pool
        self.alloc = pool.allocator
        self.cache = cache
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_hit_tokens = 0
        # An eviction walks the whole prefix tree, so a shortfall frees at least this many pages at
        # once: else, with the pool full of cached pages, every row that crosses into a new page walks
        # the tree (~25k nodes at the 8B serving benchmark's pool; docs/performance.md).
        self.evict_batch = max(1, self.alloc.num_usable // 64)

    # ----- queue management -----
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req: Request) -> None:
        """Take a request out (finished or aborted) and release its pages; its computed full pages
        stay in the prefix cache for later requests."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.cache_computed(req)
        self.alloc.decref(req.pages)
        req.pages = []

    def release_handle(self, req: Request) -> None:
        if req.release_on_admit is not None:
            self.alloc.decref(req.release_on_admit.pages)
            req.release_on_admit.pages = []
            req.release_on_admit = None

    def cache_computed(self, req: Request) -> None:
        n = req.num_computed
        while n and req.tokens[n - 1] < 0:  # tokens still on the device (futures.py) are not cached yet
            n -= 1
        self.cache.insert(req.tokens[:n], req.pages[: n // self.pool.page_size])

    def _drawn_last(self, req: Request) -> bool:
        """A decoding row whose last token is drawn but not yet read back (overlap scheduling): the
        engine finishes it when it reads the token; it takes no more steps."""
        return req.pending == 1 and (not req.wants_tokens or len(req.tokens) >= self.config.max_model_len)

    def _prefill_budget(self) -> int:
        """Prompt tokens this step may compute (see `SchedulerConfig.mixed_step_tokens`)."""
        cap, mixed = self.config.chunked_prefill_size, self.config.mixed_step_tokens
        decoding = sum(r.pending == 1 and not self._drawn_last(r) for r in self.running)
        if mixed is None or decoding == 0:
            return cap
        return min(cap, max(mixed - decoding, mixed // 4))

    # ----- one step -----
    def schedule(self) -> ScheduledBatch | None:
        rows: list[RowChunk] = []
        budget = self._prefill_budget()
        for req in list(self.running):
            if req.status is not Status.RUNNING or self._drawn_last(req):
                continue  # preempted while serving an earlier row of this step, or done
            n = req.pending if req.pending == 1 else min(req.pending, budget)
            if n <= 0:
                continue
            if not self._reserve(req, req.num_computed + n, may_preempt=True):
                continue
            if req.pending > 1:
                budget -= n
            rows.append(self._chunk(req, n))
        rows = [r for r in rows if r.req.status is Status.RUNNING]
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running_requests:
            req = self._next_waiting()
            if self._awaits_shared_prefix(req):
                deferred.append(req)
                if len(deferred) >= self.config.share_scan_limit:
                    break
                continue
            if not self._admit(req, budget):
                self.waiting.appendleft(req)
                break
            n = min(req.pending, budget)
            budget -= n
            rows.append(self._chunk(req, n))
        self.waiting.extendleft(reversed(deferred))  # they keep their places at the head
        return ScheduledBatch(rows) if rows else None

    def schedule_decode_ahead(self, ahead: Callable[[Request], int]) -> ScheduledBatch | None:
        """A pure decode step for multi-step graphs: every running row decodes (rows done but not yet
        read back sit out) and nothing waits. Pages for `ahead(req)` tokens a row are reserved now
        (evicting cache, never preempting), and the batch's `ahead` lists them; None when that is not
        possible, and the caller takes a single step instead."""
        if self.waiting or not self.running:
            return None
        decoding, budgets = [], []
        for req in self.running:
            if req.pending != 1:
                if req.pending:
                    return None  # still reading its prompt
                continue
            if not self._drawn_last(req):
                decoding.append(req)
                budgets.append(ahead(req))
        if not decoding or not self._grow_ahead(decoding, budgets):
            return None
        rows = [RowChunk(r, r.num_computed, r.num_computed + 1, True) for r in decoding]
        return ScheduledBatch(rows, budgets)

    def _chunk(self, req: Request, n: int) -> RowChunk:
        start = req.num_computed
        end = start + n
        return RowChunk(req, start, end, sample=end == len(req.tokens) and req.wants_tokens)

    def _next_waiting(self) -> Request:
        if self.config.policy == "lpm" and len(self.waiting) > 1:
            best = max(self.waiting, key=lambda r: len(self.cache.match(r.tokens, r.max_prefix_match())[1]))
            self.waiting.remove(best)
            return best
        return self.waiting.popleft()

    def _awaits_shared_prefix(self, req: Request) -> bool:
        """Whether `req` shares at least `share_min_tokens` more prompt tokens with a row still
        prefilling (this step's admissions included) than the cache holds: it then waits a step or
        more, and starts from those pages once they are computed and cached."""
        min_tokens = self.config.share_min_tokens
        if min_tokens <= 0 or not self.cache.enabled or req.preemptions:
            return False
        ps = self.pool.page_size
        limit = req.max_prefix_match()
        cached = len(self.cache.match(req.tokens, limit)[1])
        # pages past the cached ones a prefilling row could give `req`
        wanted = min(limit, len(req.tokens)) // ps
        if (wanted - cached) * ps < min_tokens:
            return False
        for other in self.running:
            if other.pending <= 1 or other.status is not Status.RUNNING:
                continue  # decoding (its prompt is cached) or preempted
            shared = _shared_pages(req.tokens, other.tokens, ps, wanted)
            if (shared - cached) * ps >= min_tokens:
                return True
        return False

    def _admit(self, req: Request, budget: int) -> bool:
        nodes, pages = self.cache.match(req.tokens, req.max_prefix_match())
        self.alloc.incref(pages)  # hold the prefix while we look for room
        self.release_handle(req)  # the program's previous step: its pages are matched (or not needed) now
        req.pages = list(pages)
        req.num_computed = len(pages) * self.pool.page_size
        n = min(req.pending, budget)
        # Keep one page of headroom per running row so admission does not force a preemption next step.
        headroom = len(self.running)
        need = self.pool.pages_for(req.num_computed + n) - len(req.pages)
        if req.protected:  # a compiled program's step is admitted only with room for its worst case
            need = max(need, self.pool.pages_for(self._worst_case(req)) - len(req.pages))
        if not self._ensure_free(need + headroom, req):
            self.alloc.decref(req.pages)
            req.pages, req.num_computed = [], 0
            return False
        self._grow(req, req.num_computed + n)
        if req.status is Status.WAITING and req.preemptions == 0:
            req.cached_tokens = req.num_computed
            self.prefix_hit_tokens += req.num_computed
        req.status = Status.RUNNING
        self.running.append(req)
        return True

    # ----- memory -----
    def _worst_case(self, req: Request) -> int:
        return req.prompt_len + req.params.max_new_tokens

    def _promised(self, req: Request) -> int:
        """Pages a protected request may still take up to its worst case."""
        return max(0, self.pool.pages_for(self._worst_case(req)) - len(req.pages))

    def _reserved(self, exclude: Request | None) -> int:
        """Pages promised to running protected requests (compiled programs) and not yet taken."""
        return sum(self._promised(r) for r in self.running if r.protected and r is not exclude)

    def _ensure_free(self, pages: int, req: Request | None = None) -> bool:
        """`pages` free for `req`, evicting cache first. A protected request (or none) gets only pages
        beyond what other protected requests are promised; an unprotected one may borrow promised
        pages, since it is preempted first when a protected request grows into them."""
        borrows = req is not None and not req.protected
        reserved = self._reserved(req) if self.running and not borrows else 0
        short = pages + reserved - self.alloc.num_free
        if short > 0:
            self.cache.evict(max(short, self.evict_batch))
        return self.alloc.num_free - reserved >= pages

    def _grow(self, req: Request, num_tokens: int) -> None:
        need = self.pool.pages_for(num_tokens) - len(req.pages)
        if need > 0:
            new = self.alloc.alloc(need)
            assert new is not None, "caller ensured free pages"
            req.pages.extend(new)

    def _grow_ahead(self, reqs: list[Request], ahead: list[int]) -> bool:
        """Pages for `ahead[i]` more tokens of each `reqs[i]` past its computed ones, as `_grow_each`
        gives them; False at the first that cannot have them. A decode-ahead batch grows most of its
        rows at once, so where the free pages cover them all without evicting (the common case) one
        allocation serves every row, in the order they would have taken pages one by one, and the
        pages promised to protected rows are summed once and kept current, not summed again for each
        row."""
        growing: list[tuple[Request, int]] = []
        free, promised_all = self.alloc.num_free, None
        for req, n in zip(reqs, ahead):
            need = self.pool.pages_for(req.num_computed + n) - len(req.pages)
            if need <= 0:
                continue
            reserved = 0  # what `_ensure_free(need, req)` keeps back: nothing for a row that borrows
            if req.protected:
                if promised_all is None:
                    promised_all = self._reserved(None)
                own = self._promised(req)
                reserved = promised_all - own  # `_reserved(req)`
                promised_all += max(0, own - need) - own  # what req is promised once grown
            if need + reserved > free:  # `_ensure_free` would evict, or fail
                return self._grow_each(reqs, ahead)
            free -= need
            growing.append((req, need))
        if growing:
            new = self.alloc.alloc(self.alloc.num_free - free)  # what the rows need together
            assert new is not None, "checked against the free pages"
            taken = 0
            for req, need in growing:
                req.pages.extend(new[taken : taken + need])
                taken += need
        return True

    def _grow_each(self, reqs: list[Request], ahead: list[int]) -> bool:
        """Pages for `ahead[i]` more tokens of each `reqs[i]`, one request after the other (evicting
        cache where short, never preempting); False at the first that cannot have them, those before
        it grown."""
        for req, n in zip(reqs, ahead):
            upto = req.num_computed + n
            need = self.pool.pages_for(upto) - len(req.pages)
            if need > 0:
                if not self._ensure_free(need, req):
                    return False
                self._grow(req, upto)
        return True

    def _reserve(self, req: Request, num_tokens: int, may_preempt: bool) -> bool:
        """Pages for `req` up to `num_tokens`, evicting cache and then preempting newer requests."""
        need = self.pool.pages_for(num_tokens) - len(req.pages)
        while not self._ensure_free(need, req):
            victim = self._preemption_victim()
            if victim is None or not may_preempt:
                return False
            self.preempt(victim)
            if victim is req:
                return False
        self._grow(req, num_tokens)
        return True

    def _preemption_victim(self) -> Request | None:
        """The newest running request; a compiled program's step only when nothing else is left."""
        candidates = [r for r in self.running if r.status is Status.RUNNING]
        unprotected = [r for r in candidates if not r.protected]
        pool = unprotected or candidates
        return max(pool, key=lambda r: r.arrival) if pool else None

    def preempt(self, req: Request) -> None:
        log.info("preempting %s (%d tokens) to free KV pages", req.rid, len(req.tokens))
        self.running.remove(req)
        self.cache_computed(req)
        self.alloc.decref(req.pages)
        req.pages, req.num_computed = [], 0
        req.status = Status.WAITING
        req.preemptions += 1
        self.waiting.appendleft(req)


def _shared_pages(a: list[int], b: list[int], page_size: int, limit: int) -> int:
    """Leading full pages (at most `limit`) on which token lists `a` and `b` agree."""
    n = 0
    while n < limit and a[n * page_size : (n + 1) * page_size] == b[n * page_size : (n + 1) * page_size]:
        n += 1
    return n
