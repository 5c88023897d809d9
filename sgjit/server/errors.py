"""OpenAI-style error responses, `{"error": {"message", "type", "param", "code"}}`, for every way a
request can fail: sgjit's own exceptions map to a status by class, FastAPI's validation errors (422)
become 400 like OpenAI's, and anything unforeseen is logged with its traceback and still answered
in the same shape, so a client never sees a bare stack trace or a non-JSON body."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sgjit import errors as E
from sgjit.server.protocol import FORMAT_TAGS

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "1"


@dataclass
class ApiError(Exception):
    """An error as the client will see it."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ClientDisconnected(Exception):
    """The HTTP client went away before its result was ready (answered, for the logs, with 499)."""


def unavailable(message: str, code: str) -> ApiError:
    """503 with Retry-After: the server cannot take this request now but will later."""
    return ApiError(503, message, "service_unavailable", None, code, {"Retry-After": RETRY_AFTER_SECONDS})


def to_api_error(exc: BaseException) -> ApiError:
    """The client-facing form of any exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, E.InvalidRequestError):
        code = {
            E.ContextLengthError: "context_length_exceeded",
            E.GrammarError: "invalid_grammar",
            E.ConflictingParamsError: "conflicting_parameters",
            E.ModelCapabilityError: "unsupported_by_model",
            E.VocabularyError: "token_out_of_vocabulary",
        }
        return ApiError(400, str(exc), param=exc.param, code=code.get(type(exc), "invalid_value"))
    if isinstance(exc, E.CapacityError):
        return ApiError(400, str(exc), code="capacity_exceeded")
    if isinstance(exc, E.ProgramError):
        return ApiError(400, str(exc), code="invalid_program")
    if isinstance(exc, E.ModelNotFoundError):
        return ApiError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, E.TensorParallelError):  # the log names the rank and its error
        return unavailable(
            "a tensor-parallel rank of this server failed; the server must be restarted",
            "tensor_parallel_failed",
        )
    if isinstance(exc, E.ServerBusyError):
        return unavailable(str(exc), "server_busy")
    if isinstance(exc, E.RequestAbortedError):
        return unavailable(f"the request was stopped before it finished ({exc})", "request_aborted")
    if isinstance(exc, ClientDisconnected):
        return ApiError(499, "the client closed the connection", code="client_disconnected")
    if isinstance(exc, RequestValidationError):
        return _validation_error(exc)
    if isinstance(exc, StarletteHTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return ApiError(exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {}))
    return internal_error(exc, "a request")


def internal_error(exc: BaseException, what: str) -> ApiError:
    """A 500 that tells the client nothing of the server's insides (exception text can hold paths,
    prompts of other requests or library versions) but names the id under which the log holds the
    traceback."""
    request_id = uuid.uuid4().hex[:16]
    log.error("unexpected error serving %s (request id %s)", what, request_id, exc_info=exc)
    return ApiError(
        500,
        f"internal server error (request id {request_id}); the server log has the details under this id",
        "server_error",
        code="internal_error",
        headers={"X-Request-Id": request_id},
    )


def _validation_error(exc: RequestValidationError) -> ApiError:
    """FastAPI's 422 as OpenAI's 400: the first problem, with the field it is about as `param`."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
    loc = _field_path(first.get("loc", ()))
    if first.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        loc.append(str(first.get("ctx", {}).get("discriminator", "")).strip("'"))
    if first.get("type") == "json_invalid":
        error = first.get("ctx", {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON ({error})", code="invalid_json")
    if not loc and first.get("type") == "missing":
        return ApiError(400, "the request body is empty; send a JSON object", code="invalid_body")
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return ApiError(
            400,
            "the request body must be a JSON object (send Content-Type: application/json)",
            code="invalid_body",
        )
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return ApiError(400, message, param=param, code="invalid_value")


def _field_path(loc: tuple[Any, ...]) -> list[str]:
    """The request fields of a pydantic error location, without the names pydantic adds for union
    members: `body`, the member's type (`text.str`) or, under a discriminated union such as
    `response_format`, its tag (`response_format.json_schema.json_schema`)."""
    parts = [str(p) for p in loc]
    out: list[str] = []
    for i, part in enumerate(parts):
        tag = i > 0 and parts[i - 1] == "response_format" and part in FORMAT_TAGS
        if part != "body" and not tag and not _is_union_tag(part):
            out.append(part)
    return out


def _is_union_tag(part: str) -> bool:
    """pydantic names the union member that failed (`text.str`, `input_ids.list[int]`) in the
    location; the client only needs the field."""
    return part in ("str", "int", "float", "bool", "list", "dict") or "[" in part


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        error = to_api_error(exc)
        if 400 <= error.status < 500 and error.status != 499:  # the client's mistake: one line, no trace
            log.info("%s %s -> %d: %s", request.method, request.url.path, error.status, error.message)
        return error.response()

    # NOTE: no `Exception` entry: starlette would hand that one to its ServerErrorMiddleware, which
    # answers and then re-raises, closing a keep-alive connection; `InternalErrorMiddleware` answers
    # the unforeseen instead.
    known = (ApiError, ClientDisconnected, E.SgjitError, RequestValidationError, StarletteHTTPException)
    for kind in known:
        app.add_exception_handler(kind, handle)
