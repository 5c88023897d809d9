"""`sgjit serve`: bind, load and warm up the model while /health answers 503, log one ready line,
serve; on SIGTERM / Ctrl-C drain (no new work, /health 503, running requests finish within
--drain-timeout) and exit 0. A second SIGTERM or Ctrl-C exits at once."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from dataclasses import asdict
from types import FrameType

import uvicorn

from sgjit.errors import SgjitError
from sgjit.runtime.loader import resolve_model
from sgjit.runtime.model.presets import RANDOM_PREFIX
from sgjit.runtime.parallel.launch import LaunchEnv, serve_launched_rank
from sgjit.runtime.runtime import Runtime
from sgjit.server.app import create_app
from sgjit.server.args import ServerArgs
from sgjit.server.connections import AcceptErrorFilter, connection_cap, guarded_h11, raise_fd_limit
from sgjit.server.info import ready_line
from sgjit.server.state import ServerState

log = logging.getLogger("sgjit.server")

WARMUP_PROMPT = "Hello"
LISTEN_BACKLOG = 2048
UVICORN_GRACE_S = 1.0  # after the drain deadline: for aborted streams to end, then for uvicorn's own wait
KEEP_ALIVE_S = 30  # idle time between requests; above the 5-10 s idle timeouts of common client pools


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain phase in front of its own shutdown, keeping the socket open
    meanwhile so a load balancer polling /health sees the 503."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_deadline: float | None = None
        self.aborted = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # NOTE: not calling super(): uvicorn would re-raise the signal after shutdown, and a
        # re-raised SIGTERM ends the process with status -15 instead of a clean 0.
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.state.args.drain_timeout
            self.state.begin_drain()
            log.info(
                "%s: draining %d request(s) (up to %.0f s; a second signal stops now)",
                signal.Signals(sig).name, len(self.state.groups), self.state.args.drain_timeout,
            )  # fmt: skip
        else:  # a second signal, SIGTERM as well as Ctrl-C: an orchestrator that repeats itself means it
            log.warning("%s again: stopping now", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptErrorFilter())
        await super().startup(sockets=sockets)

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s: once nothing is in flight, exit; at the deadline, abort what still runs (its
        streams end with an error event) and give them a moment to say so before uvicorn's own
        shutdown cancels whatever is left."""
        if self.drain_deadline is not None:
            now = time.monotonic()
            if not self.state.groups or now >= self.drain_deadline + UVICORN_GRACE_S:
                self.should_exit = True
            elif now >= self.drain_deadline and not self.aborted:
                log.warning("drain timeout: aborting %d request(s) still running", len(self.state.groups))
                self.state.abort_in_flight()
                self.aborted = True
        return await super().on_tick(counter)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvicorn's own start-up lines would compete with the ready line; its errors still show.
    logging.getLogger("uvicorn.error").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so a busy port fails at once.

    NOTE: created as IPPROTO_TCP rather than protocol 0: asyncio turns Nagle's algorithm off only
    on sockets that say they are TCP, and with it on, a response's second write waits for the
    client's delayed ACK, adding ~40 ms to every request."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        raise SgjitError(
            f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port or --host"
        ) from e
    return sock


def uvicorn_config(app, args: ServerArgs) -> uvicorn.Config:
    """uvicorn's settings, with the h11 protocol (pinned, so the connection guards always apply)
    capping connections under the fd limit and timing out request heads. No `limit_concurrency`:
    it answers 503 per request but still accepts every connection, which the cap does instead."""
    cap = connection_cap(args.max_connections, raise_fd_limit())
    return uvicorn.Config(
        app,
        http=guarded_h11(cap, args.header_timeout, KEEP_ALIVE_S),
        log_config=None,
        access_log=args.log_level == "debug",
        lifespan="off",
        timeout_graceful_shutdown=UVICORN_GRACE_S,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def load_runtime(args: ServerArgs) -> Runtime:
    rt = Runtime(**asdict(args.runtime))
    rt.generate(WARMUP_PROMPT, {"max_new_tokens": 2, "temperature": 0})  # first-call costs happen here
    return rt


def serve(args: ServerArgs) -> int:
    """Run the server until it is told to stop; the exit status."""
    configure_logging(args.log_level)
    launch = LaunchEnv.read(args.runtime.tp)
    if launch is not None and launch.rank != 0:  # torchrun started this rank: rank 0 serves HTTP
        serve_launched_rank(args.runtime, launch)
        return 0
    model = args.runtime.model
    if model is None or not model.startswith(RANDOM_PREFIX):
        resolve_model(model)  # a wrong name or path fails before anything binds or loads
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    app = create_app(args)
    server = DrainingServer(uvicorn_config(app, args), app.state.sgjit)
    return asyncio.run(_serve(server, sock, url))


async def _serve(server: DrainingServer, sock: socket.socket, url: str) -> int:
    state = server.state
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    log.info("loading the model; %s/health answers 503 until it is ready", url)
    loading = _in_daemon_thread(load_runtime, state.args)
    await asyncio.wait({serving, loading}, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if loading.done():
        try:
            state.set_ready(loading.result())
            if server.drain_deadline is not None:
                state.begin_drain()  # a signal came while loading
            log.info(ready_line(state, url))
        except Exception as e:  # noqa: BLE001 - any load failure ends the server with status 1
            log.error("could not load the model: %s", e, exc_info=not isinstance(e, SgjitError))
            server.should_exit = True
            status = 1
    await serving
    if state.runtime is not None:
        state.runtime.shutdown()
    log.info("stopped")
    return status


def _in_daemon_thread(fn, *args) -> asyncio.Future:
    """`fn(*args)` on a daemon thread: unlike the default executor, an exit during a long model load
    does not wait for the load to finish."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            outcome = (fut.set_result, fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the event loop
            outcome = (fut.set_exception, e)
        try:
            loop.call_soon_threadsafe(*outcome)
        except RuntimeError:  # the server stopped while this ran: nobody waits for it
            pass

    threading.Thread(target=run, name="sgjit-load", daemon=True).start()
    return fut
