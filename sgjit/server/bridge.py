"""`RequestGroup`: the engine requests behind one HTTP call, bridged onto the event loop. The engine
calls each request's sink on its own thread; the sink only schedules a put on the loop's queue, so
routes consume updates with plain `await`. Closing the group aborts whatever has not finished, so
a disconnect, a cancelled task or an error frees the KV pages at once rather than when the
sequences would have ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Request as HttpRequest

from sgjit.errors import InvalidRequestError
from sgjit.runtime.request import Request
from sgjit.runtime.result import GenerateResult, RequestUpdate
from sgjit.server.errors import ClientDisconnected

if TYPE_CHECKING:
    from sgjit.server.state import ServerState


class RequestGroup:
    def __init__(self, state: ServerState, reqs: list[Request], *, observe: bool = True) -> None:
        """`observe=False` keeps the group out of the latency histograms (internal prefills)."""
        self.state = state
        self.observe = observe
        self.runtime = state.loaded()
        cfg = self.runtime.config
        limit = cfg.max_running_requests + cfg.max_waiting_requests
        if len(reqs) > limit:
            raise InvalidRequestError(
                f"this request needs {len(reqs)} sequences (prompts x n) but the server holds at most {limit} "
                "at once; split it into smaller requests",
                "n",
            )
        self.reqs = reqs
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, RequestUpdate]] = asyncio.Queue()
        self._unfinished = set(range(len(reqs)))
        self._submitted = 0
        self._closed = False
        self._start = time.monotonic()
        self._last_token: list[float | None] = [None] * len(reqs)

    # ----- lifecycle -----
    def submit(self) -> RequestGroup:
        """Hand every request to the engine; on `ServerBusyError` the ones already in are aborted."""
        assert self._submitted == 0 and not self._closed, "a RequestGroup is submitted once"
        self.state.groups.add(self)
        try:
            for i, req in enumerate(self.reqs):
                self.runtime.submit(req, lambda u, i=i: self._deliver(i, u))
                self._submitted += 1
        except BaseException:
            self.close()
            raise
        return self

    def abort(self) -> None:
        """Stop the requests still running; each then delivers a final update with an error."""
        for i in self._unfinished:
            if i < self._submitted:
                self.runtime.abort(self.reqs[i].rid)

    def close(self) -> None:
        """Abort what still runs and leave the set of groups in flight; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.state.groups.discard(self)
        self.abort()

    async def __aenter__(self) -> RequestGroup:
        """`async with RequestGroup(...).submit() as group:` closes the group however the block ends."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _deliver(self, index: int, update: RequestUpdate) -> None:
        """Runs on the engine's output thread."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, update))
        except RuntimeError:  # the event loop has closed (server shut down): nobody is listening
            pass

    # ----- consuming -----
    async def updates(self) -> AsyncIterator[tuple[int, RequestUpdate]]:
        """(request index, update) as they arrive, until every request has finished. Raises the
        error of the first request that fails."""
        while self._unfinished:
            i, u = await self._queue.get()
            if u.finished:
                self._unfinished.discard(i)
                if u.error is not None:
                    raise u.error
            if self.observe:
                self._observe(i, u)
            yield i, u

    def _observe(self, i: int, u: RequestUpdate) -> None:
        metrics, now = self.state.metrics, time.monotonic()
        if u.token_ids:
            last = self._last_token[i]
            if last is None:
                metrics.first_token(now - self._start)
            else:
                metrics.token_gap((now - last) / len(u.token_ids))
            self._last_token[i] = now
        if u.finished:
            reason = u.result.finish_reason.type if u.result is not None and u.error is None else None
            metrics.finished(now - self._start, reason)

    async def results(self, http: HttpRequest | None = None) -> list[GenerateResult]:
        """Every request's final result, in order. With `http`, a client that disconnects first
        raises `ClientDisconnected` (the caller's `close` then aborts the requests)."""
        collect = asyncio.ensure_future(self._collect())
        if http is None:
            return await collect
        watch = asyncio.ensure_future(wait_for_disconnect(http))
        try:
            await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not collect.done():
                collect.cancel()
        if not collect.done() or collect.cancelled():
            raise ClientDisconnected()
        return collect.result()

    async def _collect(self) -> list[GenerateResult]:
        out: list[GenerateResult | None] = [None] * len(self.reqs)
        async for i, u in self.updates():
            if u.finished:
                out[i] = u.result
        return [r for r in out if r is not None]


async def wait_for_disconnect(http: HttpRequest) -> None:
    """Returns when the client closes the connection (the body has been read by then, so the only
    message left to receive is the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass
