"""`OutputThread`: token hand-out off the engine thread. The engine reads token ids back, decides
what ids alone decide, and queues the ids here; this thread detokenizes them, looks for stop strings,
formats logprobs and calls the submitters' sinks, in the order the engine queued them. It does no
torch work (the engine reads every tensor back first), so it never touches the engine's OpenMP pool.

Stop strings need the text, and the engine must learn of them to free the row: after queueing the
tokens of a request with stop strings it waits at a `barrier`, then reads `Request.text_stop`. On a
GPU the barrier comes while the next launch runs, so a stop found there costs that one launch's
tokens, which are trimmed.

With `hold` on (overlap scheduling), what the engine queues is held until it next blocks (`flush`):
on the GIL, this thread's Python and the engine's would otherwise interleave, and the engine would
wait for the hand-out while it plans the next launch. Held, the hand-out of launch N runs while
the engine waits for launch N + 1 on the device, one launch's planning (a fraction of a
millisecond) later than it could."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sgjit.runtime.output import OutputProcessor, TokenUpdate
from sgjit.runtime.request import PrefixHandle, Request

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Finish:
    req: Request
    error: Exception | None
    handle: PrefixHandle | None


_Item = list[TokenUpdate] | _Finish


class OutputThread:
    def __init__(self, processor: OutputProcessor, on_failure: Callable[[Request, Exception], None]) -> None:
        """`on_failure(req, error)`: a request's hand-out raised (its sink, its detokenizer); the engine
        then ends it with that error."""
        self.processor = processor
        self._on_failure = on_failure
        self._queue: queue.SimpleQueue[list[_Item] | threading.Event | None] = queue.SimpleQueue()
        self.hold = False  # keep what is queued until `flush` (set by the engine; see above)
        self._held: list[_Item] = []
        self.busy_seconds = 0.0  # time spent handing out, for the engine's counters
        self._thread = threading.Thread(target=self._run, name="sgjit-output", daemon=True)
        self._thread.start()

    # ----- engine thread -----
    def deliver(self, updates: list[TokenUpdate]) -> None:
        if updates:
            self._put(updates)

    def finish(self, req: Request, error: Exception | None, handle: PrefixHandle | None) -> None:
        """Queue the final update; the engine has set `req.finish_reason` and released the row."""
        self._put(_Finish(req, error, handle))

    def _put(self, item: _Item) -> None:
        self._held.append(item)
        if not self.hold:
            self.flush()

    def flush(self) -> None:
        """Hand what is held to this thread (the engine is about to block)."""
        if self._held:
            self._queue.put(self._held)
            self._held = []

    def barrier(self) -> None:
        """Wait until everything queued so far is handed out."""
        self.flush()
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def stop(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=10)

    # ----- output thread -----
    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            t0 = time.perf_counter()
            for entry in item:
                if isinstance(entry, _Finish):
                    self._finish(entry)
                else:
                    for u in entry:
                        self._take(u)
            self.busy_seconds += time.perf_counter() - t0

    def _finish(self, f: _Finish) -> None:
        try:
            self.processor.finish(f.req, f.error, f.handle)
        except Exception:  # noqa: BLE001 - the sink of a finished request: nothing left to tell it
            log.exception("handing out the final update of %s failed", f.req.rid)

    def _take(self, u: TokenUpdate) -> None:
        try:
            self.processor.take(u)
        except Exception as e:  # noqa: BLE001 - one request's hand-out must not stop the others'
            log.exception("handing out tokens of %s failed", u.req.rid)
            self._on_failure(u.req, e)
