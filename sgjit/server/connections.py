"""Connection hygiene for `sgjit serve`: every socket costs a file descriptor, so idle and
half-sent connections are timed out, the number open at once is capped under the process's fd
limit (raised to its hard maximum at start), and accept failures from running out of descriptors
are logged as one rate-limited line instead of a traceback each.

uvicorn's h11 protocol times out only the idle gap *after* a response (`timeout_keep_alive`); a
connection that never sends a complete request head is kept forever, and `limit_concurrency`
answers 503 to requests but never refuses a connection. `guarded_h11` adds both on top of it."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

FD_RESERVE = 256  # descriptors kept for the model files, logs, the engine and the listening socket
ACCEPT_LOG_EVERY_S = 10.0


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (the soft default, often 1024, is what
    runs out); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, e)
    return soft


def connection_cap(requested: int, fd_limit: int) -> int:
    """`--max-connections`, lowered (with a warning) to leave `FD_RESERVE` descriptors free."""
    cap = min(requested, max(fd_limit - FD_RESERVE, 1))
    if cap < requested:
        log.warning("--max-connections %d lowered to %d to fit the open-file limit of %d; raise the hard "
                    "limit (ulimit -Hn) to allow more", requested, cap, fd_limit)  # fmt: skip
    return cap


def guarded_h11(max_connections: int, header_timeout: float, keep_alive: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap and a request-head timeout."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._head_timer: asyncio.TimerHandle | None = None
            if len(self.connections) >= max_connections:
                # NOTE: closed before uvicorn tracks it: the descriptor is freed at once and the client
                # sees a reset, which load generators and proxies retry (a 503 would need a request).
                transport.abort()
                return
            super().connection_made(transport)
            self._arm(header_timeout)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # a keep-alive client then has uvicorn's idle timeout to start its next request and the
            # head timeout on top to finish sending it (uvicorn stops its own timer at the first byte)
            self._arm(keep_alive + header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.transport is None:  # refused in connection_made: uvicorn never saw it
                return
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, delay: float) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(delay, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            """A request being served is the app's business; only a connection waiting for (the rest
            of) a request head is closed."""
            self._head_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return GuardedH11Protocol


class AcceptErrorFilter:
    """A loop exception handler: asyncio reports each accept() that fails for lack of descriptors
    with a traceback; these become one warning line per `ACCEPT_LOG_EVERY_S` with a count. Every
    other report goes to the loop's default handler."""

    def __init__(self) -> None:
        self.suppressed = 0
        self.last = float("-inf")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last < ACCEPT_LOG_EVERY_S:
            self.suppressed += 1
            return
        log.warning("cannot accept connections: %s (%d more since the last report); lower --max-connections "
                    "or raise the open-file limit", context.get("exception"), self.suppressed)  # fmt: skip
        self.last, self.suppressed = now, 0
