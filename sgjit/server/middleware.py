"""Pure-ASGI middleware around the FastAPI app: a request-body size cap and the catch-all that
turns an unforeseen exception into a JSON 500. Pure ASGI (not Starlette's BaseHTTPMiddleware)
so that streamed responses and disconnect detection pass through untouched."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sgjit.server.errors import ApiError, internal_error

log = logging.getLogger(__name__)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than this server's limit of {limit} bytes "
                    "(--max-request-bytes); send a shorter prompt or fewer prompts per request",
                    code="request_too_large")  # fmt: skip


class BodyLimitMiddleware:
    """Refuses a body over `limit` bytes with 413: at once when Content-Length says so, else while
    reading a chunked body. The body is read here in full (the routes would read it all anyway)
    and handed on in one message, so no route ever sees more than `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await too_large(self.limit).response()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected while sending: nothing to answer
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                return await too_large(self.limit).response()(scope, receive, send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:  # after the body, only the disconnect is left to receive
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


class InternalErrorMiddleware:
    """The innermost catch-all: an exception no handler took becomes a JSON 500 that names a
    request id (the traceback goes to the log under the same id) and completes normally, so the
    connection stays usable for a keep-alive client. Starlette's own ServerErrorMiddleware answers
    too but then re-raises, and uvicorn closes the connection without `Connection: close`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:  # noqa: BLE001 - every unforeseen failure is answered, not raised
            error = internal_error(e, f"{scope.get('method')} {scope.get('path')}")
            if started:  # the status line is out: the response cannot be completed, so the
                raise  # connection must close (uvicorn does so)
            await error.response()(scope, receive, send)
