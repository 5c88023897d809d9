"""Device and dtype choice, and the memory budget that sizes the KV pool."""

from __future__ import annotations

import logging
import os

import torch

from sgjit.errors import InvalidRequestError

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}  # fmt: skip


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise InvalidRequestError(
            f"device {device!r} is not a device name (use auto, cpu, cuda or cuda:N)", "device"
        ) from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidRequestError(
            "device 'cuda' was asked for but torch sees no CUDA GPU; use device='cpu'", "device"
        )
    if dev.type not in ("cpu", "cuda"):
        raise InvalidRequestError(f"device {device!r} is not supported (cpu or cuda)", "device")
    return dev


def rank_device(device: str, local_rank: int) -> torch.device:
    """The device of a tensor-parallel rank: on GPUs, the `local_rank`-th from the one named
    (`cuda` = `cuda:0`); on a CPU, the CPU."""
    dev = resolve_device(device)
    if dev.type != "cuda" or local_rank == 0:
        return dev
    index = (dev.index or 0) + local_rank
    if index >= torch.cuda.device_count():
        raise InvalidRequestError(
            f"tensor-parallel rank {local_rank} needs GPU cuda:{index} but torch sees "
            f"{torch.cuda.device_count()}; lower tp or start from a lower device",
            "tp",
        )
    return torch.device("cuda", index)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[dtype]


def available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def kv_budget_tokens(
    device: torch.device,
    bytes_per_token: int,
    weight_bytes: int,
    mem_fraction_static: float,
    activation_reserve: int,
) -> int:
    """Tokens the KV pool may hold: on GPU, `mem_fraction_static` of device memory minus weights and
    a reserve for activations; on CPU, a tenth of available RAM, capped at 16k tokens."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = int(total * mem_fraction_static) - weight_bytes - activation_reserve
        return max(budget // bytes_per_token, 0)
    return max(min(available_host_bytes() // 10 // bytes_per_token, 16384), 0)
