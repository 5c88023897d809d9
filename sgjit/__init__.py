"""sgjit: a JIT-compiling runtime for prompt programs."""

from sgjit.errors import SgjitError
from sgjit.runtime.runtime import Runtime

__version__ = "0.1.0"

__all__ = ["Runtime", "SgjitError", "__version__"]
