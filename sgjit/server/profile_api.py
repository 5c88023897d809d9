"""Profiling and client-setup routes: `POST /start_profile` / `POST /stop_profile` write a
torch.profiler Chrome trace of the engine per window into `--profile-dir`; `GET /tokenizer` hands a
client (`sgjit.RuntimeEndpoint`) the model's tokenizer so it tokenizes exactly as the server does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from sgjit.server.errors import ApiError
from sgjit.server.json_route import OffLoopJSONRoute
from sgjit.server.protocol import ProfileRequest
from sgjit.server.state import server_state

router = APIRouter(tags=["profile"], route_class=OffLoopJSONRoute)

# A trace name becomes a file name inside --profile-dir: letters, digits, '.', '_' and '-', not
# starting with '.', so neither '../x', 'a/b', an absolute path nor a hidden file can be named.
PROFILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def confined_profile_name(profile_dir: str, name: str | None) -> str | None:
    """`name` if its trace file lies inside `profile_dir`; else a 400."""
    if name is None:
        return None
    bad = ApiError(400, "name: use 1-128 letters, digits, '.', '_' or '-' (no path, not starting with '.')",
                   param="name", code="invalid_value")  # fmt: skip
    if not PROFILE_NAME.fullmatch(name):
        raise bad
    root = Path(profile_dir).resolve()
    # belt and braces: a symlink already in the directory must not lead the trace out of it
    if not (root / f"{name}.trace.json").resolve().is_relative_to(root):
        raise bad
    return name


@router.post("/start_profile")
async def start_profile(request: Request, body: ProfileRequest | None = None) -> dict[str, Any]:
    state = server_state(request)
    if not state.args.profile_dir:
        raise ApiError(
            400, "profiling is off; start the server with --profile-dir DIR", code="profiling_disabled"
        )
    name = confined_profile_name(state.args.profile_dir, body.name if body else None)
    rt = state.loaded()
    await run_in_threadpool(rt.start_profile, state.args.profile_dir, name)
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
