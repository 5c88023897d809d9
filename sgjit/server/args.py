"""`ServerArgs` and the `sgjit serve` flags. Runtime knobs map one to one onto `RuntimeConfig`
fields (whose defaults are the only defaults); the rest is what the HTTP layer itself needs. This
module imports neither FastAPI nor uvicorn, so `sgjit serve --help` stays quick."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sgjit.errors import InvalidRequestError
from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.sampling_params import MAX_SAMPLES_PER_PROMPT
from sgjit.server.tool_formats import PARSER_CHOICES

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# (ServerArgs field, lowest, highest value its flag takes)
LIMIT_RANGES: tuple[tuple[str, int, int], ...] = (
    ("max_top_logprobs", 0, 1 << 20),
    ("max_n", 1, MAX_SAMPLES_PER_PROMPT),
    ("max_stop_strings", 0, 1 << 16),
    ("max_stop_length", 1, 1 << 20),
    ("max_stop_token_ids", 0, 1 << 16),
)
REASONING_PARSER_CHOICES = ("auto", "none", "deepseek-r1", "qwen3")
# A chat request without max_tokens stops here (or at the end of the context, if sooner). 1024
# tokens (~750 words) is more than a chat answer usually needs, yet bounds a forgotten max_tokens
# to a minute or two of CPU decoding (a chat left to fill the context ran past 300 s on CPU).
MAX_NEW_TOKENS_DEFAULT = 1024


@dataclass(slots=True)
class ServerArgs:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str | None = None
    api_key: str | None = None
    log_level: str = "info"
    # Seconds running requests may take to finish after SIGTERM / Ctrl-C. Under 10 s because container
    # runtimes (Docker's `stop`, Kubernetes' default grace period less its preStop slack) send SIGKILL
    # 10 s after SIGTERM: a longer drain would be cut short there without the streams' error events.
    drain_timeout: float = 8.0
    profile_dir: str | None = None  # where /start_profile + /stop_profile write Chrome traces
    tool_call_parser: str = "auto"  # how tool calls are written: auto (from the chat template) or a format
    # Per-request caps (enforced by sgjit.server.limits): what one client may ask of the shared engine.
    # Each bounds work or response size that grows with the value, so one request cannot stall others.
    max_top_logprobs: int = 20  # top logprobs per token: the response grows by this x tokens x prompt
    max_n: int = MAX_SAMPLES_PER_PROMPT  # samples per prompt (n); the runtime never takes more
    max_stop_strings: int = 16  # stop strings, and stop regexes, per request (each is matched per token)
    max_stop_length: int = 256  # characters per stop string or stop regex
    max_stop_token_ids: int = 64  # stop_token_ids per request
    max_request_bytes: int = 16 * 1024 * 1024  # a larger request body gets 413
    max_connections: int = 4096  # open HTTP connections; more are closed on accept (kept under the fd limit)
    header_timeout: float = 10.0  # seconds a connection may take to send a whole request head
    max_new_tokens_default: int = MAX_NEW_TOKENS_DEFAULT  # cap of a chat request without max_tokens; 0: none
    reasoning_parser: str = "auto"  # auto: from the chat template (<think> tags); none: off

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidRequestError(
                f"--port {self.port} is not a TCP port (0-65535; 0 picks a free one)", "port"
            )
        if self.drain_timeout < 0:
            raise InvalidRequestError("--drain-timeout must be >= 0 seconds", "drain_timeout")
        if self.tool_call_parser not in PARSER_CHOICES:
            raise InvalidRequestError(
                f"--tool-call-parser must be one of {', '.join(PARSER_CHOICES)}", "tool_call_parser"
            )
        for name, low, high in LIMIT_RANGES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidRequestError(
                    f"--{name.replace('_', '-')} must be an integer in [{low}, {high}]", name
                )
        if self.max_request_bytes < 1024:
            raise InvalidRequestError("--max-request-bytes must be at least 1024", "max_request_bytes")
        if self.max_connections < 1:
            raise InvalidRequestError("--max-connections must be at least 1", "max_connections")
        if self.header_timeout <= 0:
            raise InvalidRequestError("--header-timeout must be > 0 seconds", "header_timeout")
        if self.max_new_tokens_default < 0:
            raise InvalidRequestError(
                "--max-new-tokens-default must be >= 0 (0: no cap, the rest of the context)",
                "max_new_tokens_default",
            )
        if self.reasoning_parser not in REASONING_PARSER_CHOICES:
            raise InvalidRequestError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSER_CHOICES)}", "reasoning_parser"
            )
        if self.log_level not in LOG_LEVELS:
            raise InvalidRequestError(f"--log-level must be one of {', '.join(LOG_LEVELS)}", "log_level")

    def limits(self) -> dict[str, int]:
        """The per-request caps, as /get_server_info lists them."""
        return {name: getattr(self, name) for name, _, _ in LIMIT_RANGES}

    def public_dict(self) -> dict[str, Any]:
        """The arguments as /get_server_info shows them: the API key itself never leaves the process."""
        out = asdict(self)
        out["api_key"] = "<set>" if self.api_key else None
        return out


# Where `sgjit serve` differs from an in-process Runtime: a server warms up once for long traffic.
SERVE_DEFAULTS: dict[str, Any] = {"cuda_graph_warmup": True}

# (flag, RuntimeConfig field, argparse keywords); the default shown in --help is RuntimeConfig's,
# or SERVE_DEFAULTS'.
_RUNTIME_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--model", "model", {"metavar": "PATH|NAME", "help": "bundled model name, .gguf file or Hugging Face "
     "directory (default: the bundled SmolLM2-135M-Instruct, smollm2-135m)"}),
    ("--enable-jit", "enable_jit", {"action": "store_true", "help": "the whole JIT: compile and cache prompt "
     "programs (plans) and, on a GPU, sgjit's CUDA kernels and CUDA-graph decode steps; each can be switched "
     "on or off on its own with the three flags below"}),
    ("--plan-jit", "plan_jit", {"action": argparse.BooleanOptionalAction, "help": "compile and cache prompt "
     "programs (default: with --enable-jit)"}),
    ("--cuda-kernels", "cuda_kernels", {"action": argparse.BooleanOptionalAction, "help": "GPU: sgjit's CUDA "
     "kernels chosen by the kernel selector, else torch's ops (default: with --enable-jit)"}),
    ("--cuda-graph", "cuda_graph", {"action": argparse.BooleanOptionalAction, "help": "GPU: decode steps "
     "captured as CUDA graphs (default: with --enable-jit)"}),
    ("--disable-cuda-graph", "cuda_graph", {"action": "store_false", "help": "SGLang's name for --no-cuda-graph"}),
    ("--cuda-graph-warmup", "cuda_graph_warmup", {"action": argparse.BooleanOptionalAction, "help": "GPU: "
     "capture the decode graph of every batch size while loading, so no request waits for a capture "
     "(tp = 1; with tensor parallelism graphs are captured when first needed)"}),
    ("--num-threads", "num_threads", {"type": int, "help": "CPU: intra-op threads (default: torch's choice)"}),
    ("--device", "device", {"help": "auto (a CUDA GPU if there is one), cpu, cuda or cuda:N"}),
    ("--tp", "tp", {"type": int, "help": "tensor-parallel ranks: the model split over this many GPUs "
     "(cuda:N onwards; one process each, started by the server, or by torchrun when it sets RANK and "
     "WORLD_SIZE), or on a CPU over this many processes"}),
    ("--tp-size", "tp", {"type": int, "help": "SGLang's name for --tp"}),
    ("--dtype", "dtype", {"help": "compute dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16 or float16"}),
    ("--mem-fraction-static", "mem_fraction_static", {"type": float, "help": "GPU: share of device memory "
     "for the weights and the KV cache"}),
    ("--max-total-tokens", "max_total_tokens", {"type": int, "help": "KV cache size in tokens "
     "(default: sized from memory)"}),
    ("--max-model-len", "max_model_len", {"type": int, "help": "longest sequence, prompt plus output "
     "(default: the model's context, capped by the KV cache)"}),
    ("--max-running-requests", "max_running_requests", {"type": int, "help": "requests decoded together"}),
    ("--max-waiting-requests", "max_waiting_requests", {"type": int, "help": "requests queued beyond the "
     "running ones before new ones get 503 + Retry-After"}),
    ("--chunked-prefill-size", "chunked_prefill_size", {"type": int, "help": "prompt tokens computed per "
     "engine step (longer prompts are prefilled in chunks)"}),
    ("--mixed-step-tokens", "mixed_step_tokens", {"type": int, "help": "token budget of a step that "
     "carries decode rows: decode rows plus prompt chunk, so long prompts do not stall decoding "
     "(default: 2048 on a GPU, 1024 on a CPU; a value >= --chunked-prefill-size + --max-running-requests "
     "turns it off)"}),
    ("--overlap-schedule", "overlap_schedule", {"action": argparse.BooleanOptionalAction, "help": "launch "
     "the next step while the device runs the current one, its decode rows reading the tokens on the "
     "device (default: on for a GPU with --tp 1)"}),
    ("--jit-cache-limit", "jit_cache_limit", {"type": int, "help": "compiled plans kept (LRU)"}),
    ("--kv-cache-dtype", "kv_cache_dtype", {"choices": ("auto", "fp8_e4m3"), "help": "KV cache storage: "
     "auto (the compute dtype) or fp8_e4m3 (with the checkpoint's per-layer k/v scales when it has them)"}),
    ("--quantization", "quantization", {"choices": ("auto", "gguf", "fp8", "none"), "help": "auto: on "
     "the CPU a GGUF file's 4/8-bit GEMM weights stay packed and sgjit's C++ kernels compute on them "
     "(dequantized where those cannot be built), FP8 checkpoints stay FP8 on GPUs with FP8 tensor "
     "cores, the rest is dequantized; gguf: packed GGUF weights or an error; fp8: the layers' weights "
     "in FP8 e4m3 with per-channel scales (GPU; quantized at load unless the checkpoint is FP8); "
     "none: dequantized at load"}),
    ("--enable-deterministic-inference", "deterministic", {"action": "store_true", "help": "GPU, with "
     "sgjit's CUDA kernels: batch-invariant GEMMs and attention, so a request's tokens do not depend on "
     "what it is batched or chunked with (costs speed; docs/performance.md)"}),
)  # fmt: skip


_LIMIT_HELP = {
    "max_top_logprobs": "most top logprobs per token a request may ask for (top_logprobs_num, top_logprobs, "
    "logprobs)",
    "max_n": f"most samples per prompt a request may ask for (n; at most {MAX_SAMPLES_PER_PROMPT})",
    "max_stop_strings": "most stop strings (and, separately, stop regexes) per request",
    "max_stop_length": "longest stop string or stop regex, in characters",
    "max_stop_token_ids": "most stop_token_ids per request",
}


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    defaults = replace(RuntimeConfig(), **SERVE_DEFAULTS)
    for flag, name, kwargs in _RUNTIME_FLAGS:
        default = getattr(defaults, name)
        if name == "dtype" and default is None:
            default = "auto"
        p.add_argument(flag, dest=name, default=default, **_with_default(kwargs, default))
    server = ServerArgs()
    p.add_argument("--host", default=server.host, help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=server.port, help="TCP port; 0 picks a free one (default: %(default)s)"
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name the OpenAI API reports and accepts (default: the model's own name)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (default: no key)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=server.drain_timeout,
        help="on SIGTERM / Ctrl-C, seconds running requests may take to finish; under the usual 10 s a "
        "container runtime waits before SIGKILL; a second signal stops at once (default: %(default)s)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=server.max_request_bytes,
        help="largest request body; a larger one gets 413 (default: %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=server.max_connections,
        help="open HTTP connections at once; further ones are closed as they arrive. Lowered at start to "
        "fit the process's open-file limit (default: %(default)s)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=server.header_timeout,
        help="seconds a connection may stay open without sending a complete request head, idle or "
        "half-sent (default: %(default)s)",
    )
    p.add_argument("--log-level", default=server.log_level, choices=LOG_LEVELS, help="(default: %(default)s)")
    p.add_argument(
        "--tool-call-parser",
        default=server.tool_call_parser,
        choices=PARSER_CHOICES,
        help="how the model writes tool calls: hermes (also qwen25), llama3_json, mistral, deepseek_v3, "
        "or auto: the format the chat template shows, hermes when it shows none (default: %(default)s)",
    )
    p.add_argument(
        "--profile-dir",
        default=None,
        help="enable POST /start_profile and /stop_profile, writing torch.profiler Chrome traces here",
    )
    p.add_argument(
        "--max-new-tokens-default",
        type=int,
        default=server.max_new_tokens_default,
        help="most tokens a chat request without max_tokens generates (it gets the rest of the context, "
        "up to this); 0: no cap (default: %(default)s)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=server.reasoning_parser,
        choices=REASONING_PARSER_CHOICES,
        help="split <think>...</think> into the chat message's reasoning_content: deepseek-r1 (output starts "
        "inside the block), qwen3 (the model opens it), auto (when the chat template has thinking tags), "
        "none (default: %(default)s)",
    )

    for name, help_ in _LIMIT_HELP.items():
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=int, default=getattr(server, name), help=f"{help_} (default: %(default)s)")


def _with_default(kwargs: dict[str, Any], default: Any) -> dict[str, Any]:
    if kwargs.get("action") in ("store_true", "store_false") or default is None:
        return kwargs
    return {**kwargs, "help": f"{kwargs['help']} (default: %(default)s)"}


def server_args_from(ns: argparse.Namespace) -> ServerArgs:
    """Raises `InvalidRequestError` naming the flag when a value is out of range."""
    runtime = RuntimeConfig(**{name: getattr(ns, name) for _, name, _ in _RUNTIME_FLAGS})
    return ServerArgs(
        runtime=runtime,
        host=ns.host,
        port=ns.port,
        served_model_name=ns.served_model_name,
        api_key=ns.api_key,
        log_level=ns.log_level,
        drain_timeout=ns.drain_timeout,
        profile_dir=ns.profile_dir,
        tool_call_parser=ns.tool_call_parser,
        **{name: getattr(ns, name) for name, _, _ in LIMIT_RANGES},
        max_request_bytes=ns.max_request_bytes,
        max_connections=ns.max_connections,
        header_timeout=ns.header_timeout,
        max_new_tokens_default=ns.max_new_tokens_default,
        reasoning_parser=ns.reasoning_parser,
    )
