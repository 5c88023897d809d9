"""The route class of every router: a large JSON body is parsed on a worker thread, so a client
sending megabytes of prompt does not hold the event loop (and every other client's /health or
stream) for the tens of milliseconds `json.loads` takes. FastAPI then finds the parsed body
where `Request.json()` caches it; small bodies take FastAPI's own path."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

OFF_LOOP_BYTES = 256 * 1024  # below this, parsing takes well under a millisecond


def _parse(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None  # FastAPI parses it again and answers with its own error


class OffLoopJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            body = await request.body()  # read (and kept) here instead of in FastAPI's handler
            if len(body) > OFF_LOOP_BYTES:
                parsed = await run_in_threadpool(_parse, body)
                if parsed is not None:
                    request._json = parsed  # where Request.json() keeps what it parsed
            return await handler(request)

        return route
