"""sgjit: a JIT-compiling runtime for prompt programs. The public API: the language (`sgjit.lang`),
the in-process `Runtime` and the HTTP `RuntimeEndpoint`, plans and errors."""

from sgjit import lang
from sgjit.compiler.plan import GraphPlan
from sgjit.errors import SgjitError
from sgjit.lang import *  # noqa: F403 - the language is the API; its __all__ says what that is
from sgjit.runtime.runtime import Runtime
from sgjit.version import __version__

__all__ = [
    *lang.__all__,
    "GraphPlan",
    "Runtime",
    "SgjitError",
    "__version__",
]
