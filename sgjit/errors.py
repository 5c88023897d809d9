"""User-facing exceptions. Every error a user or a client can cause derives from `SgjitError` and says
what to do about it; the server maps them to HTTP statuses by class."""

from __future__ import annotations


class SgjitError(Exception):
    """Base class of every sgjit error a user can act on."""


class ModelNotFoundError(SgjitError):
    """No model at the given name or path."""


class ModelFormatError(SgjitError):
    """The model file exists but cannot be read (not GGUF, truncated, missing tensors)."""


class UnsupportedModelError(SgjitError):
    """The model's architecture or quantization type is not supported."""


class InvalidRequestError(SgjitError, ValueError):
    """A request carries an invalid parameter (the message names it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """The prompt (plus the tokens asked for) does not fit the model's context."""


class ConflictingParamsError(InvalidRequestError):
    """Parameters each valid alone that cannot be used together (the message says which to drop)."""


class ModelCapabilityError(InvalidRequestError):
    """The request needs something the served model lacks (e.g. fill-in-the-middle tokens)."""


class VocabularyError(InvalidRequestError):
    """A token id outside the served model's vocabulary (the range depends on the model)."""


class GrammarError(InvalidRequestError):
    """A regex, JSON schema or choice list could not be compiled into a grammar."""


class CapacityError(SgjitError):
    """A request or compiled plan can never fit in the KV cache of this runtime."""


class ServerBusyError(SgjitError):
    """The waiting queue is full; retry later."""


class RequestAbortedError(SgjitError):
    """The request was aborted before it finished."""


class ProgramError(SgjitError):
    """A prompt program is ill-formed (gen outside a function, select without choices, ...)."""


class TraceError(ProgramError):
    """A program cannot be traced into a static plan; the message names the file and line."""


class KernelError(SgjitError):
    """A CUDA kernel failed to compile or launch (callers fall back to the reference op)."""


class TensorParallelError(SgjitError):
    """A rank of a tensor-parallel runtime failed, left or fell out of step with the others. The ranks
    cannot recover together: every later request fails with this error until the runtime restarts."""
