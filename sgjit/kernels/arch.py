"""`DeviceProfile`: the properties of the device that kernel choices depend on, read from the device
(or from a recorded profile), and `arch_hash` over it and the kernel sources — the key under which
compiled plans and autotuning results are stored. The CPU is a profile too."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import xxhash

from sgjit.kernels.sources import sources_digest


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    kind: str  # "cuda" | "cpu"
    name: str
    compute_capability: tuple[int, int]  # (0, 0) on CPU
    sm_count: int  # CPU: logical cores torch uses
    smem_per_block: int  # bytes a block gets without opting in
    smem_per_block_optin: int  # bytes a block may have after cudaFuncSetAttribute
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    l2_bytes: int
    memory_bytes: int
    driver_version: int  # e.g. 13000 for CUDA 13.0; 0 when unknown
    runtime_version: int

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def cc(self) -> int:
        """Compute capability as one number (9.0 -> 90)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["compute_capability"] = tuple(values["compute_capability"])
        return cls(**values)


def cpu_profile() -> DeviceProfile:
    return DeviceProfile(
        kind="cpu", name=platform.processor() or platform.machine(), compute_capability=(0, 0),
        sm_count=torch.get_num_threads(), smem_per_block=0, smem_per_block_optin=0, smem_per_sm=0,
        regs_per_sm=0, max_threads_per_sm=0, l2_bytes=0, memory_bytes=0, driver_version=0, runtime_version=0,
    )  # fmt: skip


def _cuda_versions() -> tuple[int, int]:
    """(driver, runtime) versions; CuPy reads both, torch only knows the runtime it was built with."""
    try:
        import cupy

        return cupy.cuda.runtime.driverGetVersion(), cupy.cuda.runtime.runtimeGetVersion()
    except Exception:  # cupy missing or unusable: the runtime version torch was built with
        major, minor = (int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
        return 0, major * 1000 + minor * 10


def cuda_profile(device: torch.device) -> DeviceProfile:
    p = torch.cuda.get_device_properties(device)
    driver, runtime = _cuda_versions()
    return DeviceProfile(
        kind="cuda", name=p.name, compute_capability=(p.major, p.minor), sm_count=p.multi_processor_count,
        smem_per_block=getattr(p, "shared_memory_per_block", 48 * 1024),
        smem_per_block_optin=getattr(p, "shared_memory_per_block_optin", 48 * 1024),
        smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", 64 * 1024),
        regs_per_sm=getattr(p, "regs_per_multiprocessor", 65536),
        max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", 2048),
        l2_bytes=getattr(p, "L2_cache_size", 0), memory_bytes=p.total_memory,
        driver_version=driver, runtime_version=runtime,
    )  # fmt: skip


def device_profile(device: torch.device | str) -> DeviceProfile:
    device = torch.device(device)
    return cuda_profile(device) if device.type == "cuda" else cpu_profile()


def arch_hash(profile: DeviceProfile) -> str:
    """xxhash64 over the profile and every kernel family's source."""
    h = xxhash.xxh64()
    h.update(json.dumps(profile.as_dict(), sort_keys=True).encode())
    h.update(sources_digest().encode())
    return h.hexdigest()
