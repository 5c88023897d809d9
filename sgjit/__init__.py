"""sgjit: a JIT-compiling runtime for prompt programs. The public API: the language (`sgjit.lang`),
the in-process `Runtime` and the HTTP `RuntimeEndpoint`, plans and errors."""

from sgjit import lang
from sgjit.compiler.plan import GraphPlan
from sgjit.errors import SgjitError
from sgjit.lang import *  # noqa: F403 - the language is the API; its __all__ says what that is
from sgjit.lang.endpoint import RuntimeEndpoint
from sgjit.lang.jit_cache import clear_jit_cache
from sgjit.runtime.runtime import Runtime
from sgjit.version import __version__

__all__ = [
    *lang.__all__,
    "GraphPlan",
    "Runtime",
    "RuntimeEndpoint",
    "SgjitError",
    "__version__",
    "clear_jit_cache",
]
