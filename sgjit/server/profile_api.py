"""Profiling and client-setup routes: `POST /start_profile` / `POST /stop_profile` write a
torch.profiler Chrome trace of the engine per window into `--profile-dir`; `GET /tokenizer` hands a
client (`sgjit.RuntimeEndpoint`) the model's tokenizer so it tokenizes exactly as the server does."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from sgjit.server.errors import ApiError
from sgjit.server.protocol import ProfileRequest
from sgjit.server.state import server_state

router = APIRouter(tags=["profile"])


@router.post("/start_profile")
async def start_profile(request: Request, body: ProfileRequest | None = None) -> dict[str, Any]:
    state = server_state(request)
    if not state.args.profile_dir:
        raise ApiError(
            400, "profiling is off; start the server with --profile-dir DIR", code="profiling_disabled"
        )
    rt = state.loaded()
    await run_in_threadpool(rt.start_profile, state.args.profile_dir, body.name if body else None)
    return {"profiling": True, "dir": state.args.profile_dir}


@router.post("/stop_profile")
async def stop_profile(request: Request) -> dict[str, Any]:
    state = server_state(request)
    if not state.args.profile_dir:
        raise ApiError(
            400, "profiling is off; start the server with --profile-dir DIR", code="profiling_disabled"
        )
    path = await run_in_threadpool(state.loaded().stop_profile)
    return {"profiling": False, "trace": str(path)}


@router.get("/tokenizer")
async def tokenizer(request: Request) -> dict[str, Any]:
    tok = server_state(request).loaded().tokenizer
    return {
        "tokenizer_json": tok.backend.to_str(),
        "bos_token_id": tok.bos_token_id,
        "eos_token_ids": list(tok.eos_token_ids),
        "add_bos": tok.add_bos,
        "chat_template": tok.chat_template.source if tok.chat_template is not None else None,
        "pad_token_id": tok.pad_token_id,
    }
