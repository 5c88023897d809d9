"""`--api-key`: every route but /health wants `Authorization: Bearer KEY` (OpenAI's scheme), so
load balancers can probe liveness without the key. A pure-ASGI middleware rather than a FastAPI
dependency so that it also covers the routes FastAPI adds itself (/docs, /openapi.json) and so an
unauthenticated client is refused before its body is read or parsed. docs/reliability.md lists
the routes and why each is or is not open."""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from sgjit.server.errors import ApiError

# /health only says whether the server takes work: a load balancer or orchestrator probes it
# without credentials, and it exposes nothing else.
OPEN_PATHS = frozenset({"/health"})


def key_matches(given: str, key: str) -> bool:
    """Constant time in the key's content and length: digests of both are compared, so neither a
    shorter guess nor a longer one returns early."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(key.encode()).digest())


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and key_matches(given.strip(), self.key):
            return await self.app(scope, receive, send)
        error = ApiError(
            401,
            "missing or wrong API key; send it as 'Authorization: Bearer KEY'",
            "invalid_request_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await error.response()(scope, receive, send)
