"""The machine's ceilings, measured at the start of every benchmark run: memory bandwidth (CPU: a
read probe and a copy probe; GPU: device-to-device copy) and, on GPU, the bf16 GEMM peak."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(slots=True)
class Ceilings:
    device: str
    read_gbps: float  # bytes read per second (weights streamed by decode)
    copy_gbps: float  # read + write bytes per second
    gemm_tflops: float | None = None  # bf16 dense GEMM, GPU only

    @property
    def bandwidth_gbps(self) -> float:
        """The rate weights stream at in decoding: the copy figure on a GPU (as the lent machine's
        README quotes it), the read figure on a CPU."""
        return self.copy_gbps if self.gemm_tflops is not None else self.read_gbps

    def as_dict(self) -> dict:
        return asdict(self) | {"bandwidth_gbps": self.bandwidth_gbps}


def _median_seconds(fn, repeat: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(device: torch.device, size_mb: int = 512) -> Ceilings:
    n = size_mb * (1 << 20) // 4
    x = torch.rand(n, device=device)
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    copy_s = _median_seconds(lambda: y.copy_(x), 10, sync)
    read_s = _median_seconds(lambda: x.sum(), 10, sync)
    gemm = None
    if device.type == "cuda":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        gemm_s = _median_seconds(lambda: a @ b, 10, sync)
        gemm = 2 * 8192**3 / gemm_s / 1e12
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu x{torch.get_num_threads()} threads"
    )
    return Ceilings(name, read_gbps=4 * n / read_s / 1e9, copy_gbps=8 * n / copy_s / 1e9, gemm_tflops=gemm)
