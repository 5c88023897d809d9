"""`--api-key`: every route but /health wants `Authorization: Bearer KEY` (OpenAI's scheme), so
load balancers can probe liveness without the key."""

from __future__ import annotations

import hmac

from fastapi import Request

from sgjit.server.errors import ApiError
from sgjit.server.state import server_state

OPEN_PATHS = frozenset({"/health"})


async def require_api_key(request: Request) -> None:
    """Async so FastAPI runs it on the event loop, not through a worker thread per request."""
    key = server_state(request).args.api_key
    if key is None or request.url.path in OPEN_PATHS:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key; send it as 'Authorization: Bearer KEY'",
            "invalid_request_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
