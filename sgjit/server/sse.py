"""Server-sent events as OpenAI and SGLang frame them: `data: <json>\\n\\n` per event, ending with
`data: [DONE]\\n\\n`; an error after the stream has started is one more event carrying the usual
error JSON, then `[DONE]`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sgjit.server.bridge import RequestGroup
from sgjit.server.errors import to_api_error

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


# JSON allows these raw inside strings, but readers that split lines the way Python's str.splitlines
# does (httpx `iter_lines`) end a line at each, cutting an event in two. Their UTF-8 forms start with a
# lead byte, so a byte match never hits the middle of another character.
_LINE_BREAKS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def sse(payload: str | bytes) -> bytes:
    """One event of a JSON payload, with the Unicode line breaks JSON leaves raw escaped."""
    data = payload.encode() if isinstance(payload, str) else payload
    for raw, escaped in _LINE_BREAKS:
        data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


def sse_error(exc: BaseException) -> bytes:
    return sse(json.dumps(to_api_error(exc).body()))


async def with_error_event(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Pass events through; if producing them fails, end the stream with the error and [DONE]
    (the status line has gone out already, so the error cannot be a status)."""
    try:
        async for event in events:
            yield event
    except Exception as e:  # noqa: BLE001 - every failure becomes the stream's last event
        log.info("stream ended by an error: %s", e)
        yield sse_error(e)
        yield DONE


class SSEResponse(StreamingResponse):
    """A stream of events fed by a `RequestGroup`, which is closed however the response ends —
    finished, failed, or cancelled because the client disconnected — so nothing keeps running
    for a client that has gone (even one that left before the first event)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], group: RequestGroup) -> None:
        super().__init__(with_error_event(events), headers={"Cache-Control": "no-cache"})
        self.group = group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.close()
