"""What /openapi.json says beyond the route signatures: every error status a route can answer
(all in the OpenAI error shape), the content types of streams and of /metrics, and no 422 (the
error handlers turn FastAPI's validation errors into 400). Kept here so the routes stay short and
the schema fuzz test (tests/server/test_schema_fuzz.py) checks one description of the contract."""

from __future__ import annotations

import warnings
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from sgjit.runtime.sampling_params import KNOBS, OPENAI_KEYS, TOKEN_ID_KEY
from sgjit.server.args import ServerArgs


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {...}}`, as OpenAI's API answers every failure."""

    error: ErrorDetail


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


# Statuses any route may answer: auth and readiness apply to all of them, 400 to any malformed body.
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Invalid request: a malformed body, a value out of range or a limit of the model"),
    401: _error("Missing or wrong API key (server started with --api-key)"),
    503: _error("Starting, draining or full (with Retry-After): retry later"),
}
# Routes that run work for a client: the client may leave first (logged as 499, never seen by it).
WORK_ERRORS: dict[int | str, dict[str, Any]] = {
    499: _error("The client closed the connection before the answer was ready"),
}
NOT_FOUND = {404: _error("No such model or plan")}
TOO_LARGE = {413: _error("The request body is larger than the server accepts")}


# One server-sent event, as SSE readers (and schemathesis) parse it: `data` is the JSON text of a chunk
# or `[DONE]`
SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}


def json_or_sse(
    model: type[BaseModel] | None, chunk: str, or_list: bool = False
) -> dict[int | str, dict[str, Any]]:
    """200 of a route that streams when `stream` is true: the JSON answer or `data: <json>` events
    (`chunk` names the model of each event; they end with `data: [DONE]`). `or_list`: a batch of
    inputs is answered with a list of them."""
    # FastAPI writes the schema of `model` (with its component) into the JSON content itself
    answer: Any = (model | list[model]) if (model and or_list) else model  # type: ignore[operator]
    return {
        200: {
            "model": answer,
            "description": f"The result, or with stream=true server-sent events: one {chunk} per `data:` line, "
            "then `data: [DONE]`",
            "content": {
                "application/json": {},
                "text/event-stream": {"schema": SSE_EVENT},
            },
        }
    }


def text_response(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}}


def _branches(prop: dict[str, Any]) -> list[dict[str, Any]]:
    return prop.get("anyOf", [prop])


def _cap(prop: dict[str, Any], kind: str, key: str, value: int) -> None:
    """Set `key` (at most `value`) on every branch of `prop` of JSON type `kind`."""
    for branch in _branches(prop):
        if branch.get("type") == kind:
            branch[key] = min(branch.get(key, value), value)


def state_limits(schemas: dict[str, Any], args: ServerArgs) -> None:
    """Write this server's per-request caps (`--max-n`, `--max-stop-strings`, ...) and the form of
    logit_bias keys into the request bodies, so the document states what the server answers 400 to."""
    for name, schema in schemas.items():
        if not name.endswith("Request"):
            continue
        props = schema.get("properties", {})
        _limit(props, OPENAI_KEYS, args, completion=name == "CompletionRequest")
        for branch in _branches(props.get("sampling_params", {})):  # /generate's, under knob names
            inner = branch.get("items", branch)
            if inner.get("type") == "object":
                _limit(inner.get("properties", {}), {key: key for key in KNOBS}, args, completion=False)


def _limit(props: dict[str, Any], names: dict[str, str], args: ServerArgs, completion: bool) -> None:
    """`state_limits` on one object's properties; `names` maps its field names to knob names."""
    if "n" in props:
        _cap(props["n"], "integer", "maximum", args.max_n)
    for field in ("top_logprobs", "top_logprobs_num") + (("logprobs",) if completion else ()):
        if field in props:
            _cap(props[field], "integer", "maximum", args.max_top_logprobs)
    for field in ("stop", "stop_regex"):
        if field in props:
            _cap(props[field], "string", "maxLength", args.max_stop_length)
            _cap(props[field], "array", "maxItems", args.max_stop_strings)
            for branch in _branches(props[field]):
                if branch.get("type") == "array":
                    _cap(branch["items"], "string", "maxLength", args.max_stop_length)
                for string in (branch, branch.get("items", {})):
                    if field == "stop" and string.get("type") == "string":
                        string["minLength"] = 1  # an empty stop string would stop at once: refused
    for field, key in names.items():  # pydantic writes integer bounds as floats: 2**63 - 1 rounds up
        rng = KNOBS[key].range
        if field in props and rng is not None and KNOBS[key].accepts is int:
            for branch in _branches(props[field]):
                if branch.get("type") == "integer":
                    bounds = (("minimum", rng.lo), ("maximum", rng.hi))
                    branch.update({k: int(v) for k, v in bounds if v is not None})
    if "logit_bias" in props:  # keys are decimal token ids
        for branch in _branches(props["logit_bias"]):
            if branch.get("type") == "object":
                branch["propertyNames"] = {"pattern": "^" + TOKEN_ID_KEY.pattern + "$"}
                branch["additionalProperties"] = {"type": "number", "minimum": -100, "maximum": 100}
    if "stop_token_ids" in props:
        _cap(props["stop_token_ids"], "array", "maxItems", args.max_stop_token_ids)
    if names.get("choices") == "choices" and "choices" in props:  # /generate's list of choices
        for branch in _branches(props["choices"]):
            if branch.get("type") == "array":
                branch["minItems"] = 1


def install_openapi(app: FastAPI, args: ServerArgs) -> None:
    """Generate the document once, without FastAPI's 422 entries and their models, with the
    server's limits stated."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # its duplicate-id warning: the ids are made unique below
                warnings.filterwarnings("ignore", "Duplicate Operation ID")
                doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for operations in doc.get("paths", {}).values():
                for method, op in operations.items():
                    op.get("responses", {}).pop("422", None)
                    if len(operations) > 1:  # one route, several methods: FastAPI gives them one id
                        base = op["operationId"].rsplit("_", 1)[0]  # it ends with the first method
                        op["operationId"] = f"{base}_{method}"
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            state_limits(schemas, args)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
