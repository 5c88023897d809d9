"""The prompt-program language: `function`, `gen`, `select`, roles, program states, backends."""

from sgjit.lang.choices import (
    ChoicesMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sgjit.lang.default_backend import get_default_backend, set_default_backend
from sgjit.lang.function import Function, function
from sgjit.lang.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from sgjit.lang.reload import reload_function
from sgjit.lang.state import ProgramState, ProgramStateGroup

__all__ = [
    "ChoicesMethod",
    "Function",
    "ProgramState",
    "ProgramStateGroup",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "greedy_token_selection",
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
]
