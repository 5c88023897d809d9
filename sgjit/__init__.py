"""sgjit: a JIT-compiling runtime for prompt programs."""

from sgjit.compiler.plan import GraphPlan
from sgjit.errors import SgjitError
from sgjit.lang import (
    ChoicesMethod,
    Function,
    ProgramState,
    ProgramStateGroup,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    greedy_token_selection,
    reload_function,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
)
from sgjit.lang.jit_cache import clear_jit_cache
from sgjit.runtime.runtime import Runtime


def __getattr__(name: str):
    if name == "RuntimeEndpoint":  # lazily: the HTTP client is not needed in-process
        from sgjit.lang.endpoint import RuntimeEndpoint

        return RuntimeEndpoint
    raise AttributeError(f"module 'sgjit' has no attribute {name!r}")


from sgjit.version import __version__  # noqa: E402

__all__ = [
    "ChoicesMethod",
    "Function",
    "GraphPlan",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "SgjitError",
    "__version__",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "clear_jit_cache",
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
