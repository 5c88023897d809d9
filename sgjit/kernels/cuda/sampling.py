"""Grammar bitmask and on-device sampling (sampling.cu). Every sampling parameter is read from
device memory; the only host decision is `all_greedy` (argmax_kernel then), which the caller knows
up front."""

from __future__ import annotations

import numpy as np
import torch

from sgjit.kernels import reference
from sgjit.kernels.cuda.module import compile_kernels, launch, ptr
from sgjit.kernels.ops import DecodeAhead, SamplingTensors

SAMPLE_THREADS = 512  # sampling.cu SAMPLE_THREADS
BITMASK_BLOCK = 256
ARGMAX_THREADS = 256  # sampling.cu ARGMAX_THREADS
ARGMAX_BLOCKS_PER_SM = 8  # resident 256-thread blocks an SM holds: enough loads in flight
ARGMAX_MIN_CHUNK = 4 * 4 * ARGMAX_THREADS  # columns a block takes at least: four float4 per thread
ADVANCE_THREADS = 128
SAMPLING_NAMES = ("sample_kernel", "apply_bitmask_kernel", "argmax_kernel", "advance_decode_kernel")


class Sampling:
    def __init__(self, sm_count: int) -> None:
        kernels = compile_kernels("sampling", list(SAMPLING_NAMES))
        self.sample_kernel, self.bitmask_kernel, self.argmax_kernel, self.advance_kernel = (
            kernels[n] for n in SAMPLING_NAMES
        )
        self.sm_count = sm_count
        # argmax_kernel's per-row scratch (keys, arrival counts): zeroed once, reset by the kernel
        # itself. Outgrown buffers are kept, since a captured CUDA graph may still point at them.
        self._argmax_scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._outgrown: list[torch.Tensor] = []

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
        if st.all_greedy:
            return self.argmax(logits)
        b, vocab = logits.shape
        dev = logits.device
        out = torch.empty(b, dtype=torch.int64, device=dev)
        if generator is not None and generator.device != dev:
            generator = None
        draw = st.draw
        if draw is None:
            draw = torch.randint(0, 2**62, (1,), device=dev, dtype=torch.int64, generator=generator)
        launch(
            self.sample_kernel, (b,), SAMPLE_THREADS,
            (ptr(logits), np.int64(logits.stride(0)), np.int32(vocab), ptr(st.temperature.float()),
             ptr(st.top_p.float()), ptr(st.top_k.int()), ptr(st.min_p.float()), ptr(st.seeds.long()),
             ptr(st.steps.long()), ptr(draw), ptr(out)),
        )  # fmt: skip
        return out

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy tokens: the first maximum of each float32 row, like `logits.argmax(-1)`."""
        if logits.dtype != torch.float32 or not logits.is_cuda or logits.stride(-1) != 1 or logits.dim() != 2:
            return logits.argmax(dim=-1)
        b, vocab = logits.shape
        out = torch.empty(b, dtype=torch.int64, device=logits.device)
        if b == 0:
            return out
        splits = max(1, min(-(-ARGMAX_BLOCKS_PER_SM * self.sm_count // b), vocab // ARGMAX_MIN_CHUNK))
        chunk = -(-vocab // splits)
        chunk += -chunk % 4
        splits = -(-vocab // chunk)
        keys, arrived = self._scratch(logits.device, b)
        vec = logits.data_ptr() % 16 == 0 and logits.stride(0) % 4 == 0
        launch(
            self.argmax_kernel, (splits, b), ARGMAX_THREADS,
            (ptr(logits), np.int64(logits.stride(0)), np.int32(vocab), np.int32(chunk), np.int32(vec),
             ptr(keys), ptr(arrived), ptr(out)),
        )  # fmt: skip
        return out

    def advance_decode(self, st: DecodeAhead, tokens: torch.Tensor, step: int, out: torch.Tensor) -> None:
        """The reference's ~20 small torch kernels a step as one launch (2-3 us each inside a graph)."""
        rows = tokens.shape[0]
        vectors = (
            tokens,
            out,
            st.input_ids,
            st.positions,
            st.slots,
            st.kv_lens,
            st.budgets,
            st.stop_on_eos,
            st.done,
        )
        if (
            not tokens.is_cuda or st.page_table.stride(-1) != 1 or st.eos.stride(-1) != 1
            or any(t.stride(-1) != 1 or t.shape[0] != rows for t in vectors)
            or tokens.dtype != torch.int64 or st.kv_lens.dtype != torch.int32 or st.done.dtype != torch.bool
        ):  # fmt: skip
            return reference.advance_decode(st, tokens, step, out)
        if rows == 0:
            return None
        launch(
            self.advance_kernel, (-(-rows // ADVANCE_THREADS),), ADVANCE_THREADS,
            (ptr(tokens), np.int32(step), ptr(out), ptr(st.input_ids), ptr(st.positions), ptr(st.slots),
             ptr(st.kv_lens), ptr(st.page_table), np.int64(st.page_table.stride(0)), np.int32(st.page_table.shape[1]),
             ptr(st.budgets), ptr(st.stop_on_eos), ptr(st.done), ptr(st.eos), np.int32(st.eos.shape[0]),
             np.int32(st.page_size), np.int64(st.scratch_slot), np.int32(rows)),
        )  # fmt: skip
        return None

    def _scratch(self, dev: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, arrived = self._argmax_scratch.get(dev, (None, None))
        if keys is None or arrived is None or keys.shape[0] < rows:
            if keys is not None and arrived is not None:
                self._outgrown += [keys, arrived]
            n = max(rows, 256)
            keys = torch.zeros(n, dtype=torch.int64, device=dev)
            arrived = torch.zeros(n, dtype=torch.int32, device=dev)
            self._argmax_scratch[dev] = (keys, arrived)
        return keys, arrived
