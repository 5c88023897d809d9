"""The FastAPI app: one router per concern (native, OpenAI; the plan routes join the same way),
the API-key check, and the error handlers. The app never owns the runtime's lifetime: the launcher
(or a test) creates and shuts it down."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from sgjit.server import native_api, openai_api, plans_api, profile_api
from sgjit.server.args import ServerArgs
from sgjit.server.auth import ApiKeyMiddleware
from sgjit.server.errors import install_error_handlers
from sgjit.server.middleware import BodyLimitMiddleware, InternalErrorMiddleware
from sgjit.server.openapi_doc import COMMON_ERRORS, install_openapi
from sgjit.server.state import ServerState
from sgjit.version import __version__

if TYPE_CHECKING:
    from sgjit.runtime.runtime import Runtime

ROUTERS = (native_api.router, openai_api.router, plans_api.router, profile_api.router)


def create_app(args: ServerArgs, runtime: Runtime | None = None) -> FastAPI:
    """An app serving `runtime`; without one it answers 503 (starting) until `ServerState.set_ready`."""
    app = FastAPI(title="sgjit", version=__version__)
    app.state.sgjit = ServerState(args, runtime)
    for router in ROUTERS:
        app.include_router(router, responses=COMMON_ERRORS)
    install_error_handlers(app)
    # Each add_middleware wraps what was added before: the catch-all sits innermost, then the body
    # cap, and the key check outermost so that a client without the key gets no body read.
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=args.max_request_bytes)
    if args.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=args.api_key)
    install_openapi(app, args)
    return app
