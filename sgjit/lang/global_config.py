"""`sgjit.global_config`: SGLang's process-wide frontend settings object, for code that reads or sets
them. `default_backend` is the one `set_default_backend` sets (as it was given: a `Runtime`
stays one); the other fields are kept for SGLang
code that sets them and change nothing here (sgjit always skips special tokens in program text,
and always precaches a traced program's prefix when its JIT is on)."""

from __future__ import annotations

from typing import Any

from sgjit.lang import default_backend


class GlobalConfig:
    def __init__(self) -> None:
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Any:
        return default_backend.default_backend_as_given()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        default_backend.set_default_backend(backend)


global_config = GlobalConfig()
