"""The prompt-program language: `function`, `gen`, `select`, roles, program states, backends."""

from sgjit.lang.backend_calls import clear_jit_cache, flush_cache, get_server_info
from sgjit.lang.choices import (
    ChoicesMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgjit.lang.default_backend import get_default_backend, set_default_backend
from sgjit.lang.endpoint import RuntimeEndpoint
from sgjit.lang.function import Function, function
from sgjit.lang.global_config import global_config
from sgjit.lang.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from sgjit.lang.reload import reload_function
from sgjit.lang.state import ProgramState, ProgramStateGroup

__all__ = [
    "ChoicesMethod",
    "Function",
    "ProgramState",
    "ProgramStateGroup",
    "RuntimeEndpoint",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "clear_jit_cache",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "reload_function",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
