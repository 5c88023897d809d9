"""Grammar bitmask and on-device sampling (sampling.cu). Every sampling parameter is read from
device memory; the only host decision is `all_greedy`, which the caller knows up front."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.kernels import reference
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.ops import SamplingTensors

SAMPLE_THREADS = 512  # sampling.cu SAMPLE_THREADS
BITMASK_BLOCK = 256
SAMPLING_NAMES = ("sample_kernel", "apply_bitmask_kernel")


class Sampling:
    def __init__(self, sm_count: int) -> None:
        kernels = compile_kernels("sampling", list(SAMPLING_NAMES))
        self.sample_kernel, self.bitmask_kernel = (kernels[n] for n in SAMPLING_NAMES)
        self.sm_count = sm_count

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        if logits.dtype != torch.float32 or not logits.is_cuda or logits.stride(-1) != 1 or logits.dim() != 2:
            return reference.apply_bitmask(logits, bitmask)
        b, vocab = logits.shape
        mask = bitmask.to(device=logits.device, dtype=torch.int32).contiguous()
        grid_x = min(-(-vocab // BITMASK_BLOCK), max(1, 4 * self.sm_count // max(1, b)))
        launch(
            self.bitmask_kernel, (grid_x, b), BITMASK_BLOCK,
            (ptr(logits), ptr(mask), np.int32(vocab), np.int32(mask.shape[1]), np.int64(logits.stride(0))),
        )  # fmt: skip

    def sample(
        self, logits: torch.Tensor, st: SamplingTensors, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        if logits.dtype != torch.float32 or not logits.is_cuda or logits.stride(-1) != 1 or logits.dim() != 2:
            return reference.sample(logits, st, generator)
        b, vocab = logits.shape
        dev = logits.device
        out = torch.empty(b, dtype=torch.int64, device=dev)
        if generator is not None and generator.device != dev:
            generator = None
        draw = st.draw if st.draw is not None else out  # `out`: unused by all-greedy launches
        if not st.all_greedy and st.draw is None:
            draw = torch.randint(0, 2**62, (1,), device=dev, dtype=torch.int64, generator=generator)
        launch(
            self.sample_kernel, (b,), SAMPLE_THREADS,
            (ptr(logits), np.int64(logits.stride(0)), np.int32(vocab), ptr(st.temperature.float()),
             ptr(st.top_p.float()), ptr(st.top_k.int()), ptr(st.min_p.float()), ptr(st.seeds.long()),
             ptr(st.steps.long()), ptr(draw), ptr(out), np.int32(1 if st.all_greedy else 0)),
        )  # fmt: skip
        return out
