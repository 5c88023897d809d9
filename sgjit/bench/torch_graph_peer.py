"""The "torch+graph" peer of the latency benchmark: what plain torch reaches on the same weights with a
static KV cache and the decode step captured as one CUDA graph (gpt-fast's recipe without its
compiler): cuBLAS GEMMs, torch's RMSNorm and SiLU, SDPA. The GEMMs go through the model's `linear`
op, which on the JIT-off runtime the benchmark hands it is `F.linear` (cuBLAS; on the CPU, oneDNN on
the weights as that runtime packed them). Prefill runs eagerly over the prompt;
each greedy decode step is one graph replay that also takes the argmax and advances the position, so
the host only launches. The rows of a batch share their length (the benchmark's fixed workload).

Decode attention puts a KV head's G query heads on the query-length axis ([B, Hkv, G, D] against
[B, Hkv, L, D]), so grouped-query attention reads each cached key once, with no expanded copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from sgjit.runtime.model.llama import LlamaModel


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [B, H, T, D] on its first R dims; cos_sin [T, R] (cos | sin halves)."""
    rot = cos_sin.shape[-1]
    cos, sin = cos_sin[:, : rot // 2], cos_sin[:, rot // 2 :]
    x1, x2 = x[..., : rot // 2].float(), x[..., rot // 2 : rot].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rot:].float()], dim=-1).to(x.dtype)


class TorchGraphDecoder:
    def __init__(self, model: LlamaModel, batch: int, max_len: int) -> None:
        cfg = model.config
        self.model, self.cfg, self.max_len = model, cfg, max_len
        cache = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(cache, dtype=model.dtype, device=model.device)
        self.v = torch.zeros_like(self.k)
        self.tokens = torch.zeros(batch, 1, dtype=torch.int64, device=model.device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=model.device)  # every row's next position
        self.key_pos = torch.arange(max_len, device=model.device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, decode: bool) -> torch.Tensor:
        """Logits of the last position of every row, the new keys and values written to the cache."""
        m, cfg, eps = self.model, self.cfg, self.cfg.rms_norm_eps
        linear = m.ops.linear
        b, t = tokens.shape
        d, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        x = m.embed[tokens]
        cos_sin = m.cos_sin[positions]
        for i, layer in enumerate(m.layers):
            h = _rmsnorm(x, layer.attn_norm, eps)
            q, k, v = linear(h, layer.qkv, layer.qkv_bias).split([cfg.q_size, cfg.kv_size, cfg.kv_size], -1)
            q, k, v = (y.view(b, t, -1, d).transpose(1, 2) for y in (q, k, v))
            if layer.q_norm is not None:
                q, k = _rmsnorm(q, layer.q_norm, eps), _rmsnorm(k, layer.k_norm, eps)
            q, k = _rope(q, cos_sin), _rope(k, cos_sin)
            self.k[i].index_copy_(2, positions, k)
            self.v[i].index_copy_(2, positions, v)
            if decode:
                mask = (self.key_pos <= positions[0]).view(1, 1, 1, -1)
                o = F.scaled_dot_product_attention(
                    q.reshape(b, hkv, hq // hkv, d), self.k[i], self.v[i], mask
                )
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + linear(o.reshape(b, hq, t, d).transpose(1, 2).reshape(b, t, -1), layer.o_proj, None)
            gate, up = linear(_rmsnorm(x, layer.ffn_norm, eps), layer.mlp.gate_up, None).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, layer.mlp.down, None)
        return linear(_rmsnorm(x[:, -1], m.final_norm, eps), m.lm_head, None)

    def _decode_step(self) -> None:
        logits = self._forward(self.tokens, self.pos, decode=True)
        self.tokens.copy_(logits.argmax(-1, keepdim=True))
        self.pos.add_(1)

    def _capture(self) -> torch.cuda.CUDAGraph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: cuBLAS handles, workspaces (writes past the prompt only)
            for _ in range(2):
                self._decode_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._decode_step()
        return graph

    @torch.inference_mode()
    def generate(self, prompts: torch.Tensor, n: int) -> torch.Tensor:
        """n greedy tokens for each row of `prompts` [B, T] (the last one left in `tokens`)."""
        t = prompts.shape[1]
        if t + n > self.max_len:
            raise ValueError(f"{t} + {n} tokens exceed the static cache of {self.max_len}")
        positions = torch.arange(t, device=prompts.device)
        first = self._forward(prompts, positions, decode=False).argmax(-1, keepdim=True)
        on_gpu = prompts.device.type == "cuda"
        if n > 1 and on_gpu and self.graph is None:
            self.pos.fill_(t)
            self.graph = self._capture()  # its warm-up steps write past the prompt only
        self.tokens.copy_(first)
        self.pos.fill_(t)
        for _ in range(n - 1):
            self.graph.replay() if on_gpu else self._decode_step()  # eager on the CPU: for checking
        return self.tokens


def torch_graph_runner(rt, batch: list[list[int]], max_len: int) -> Callable[[int], Any]:
    """`generate` of exactly n tokens for the batch on the runtime's model weights, run on its engine
    thread (where all of a runtime's torch work happens)."""
    if len({len(ids) for ids in batch}) != 1:
        raise ValueError("the torch+graph peer takes rows of one length")
    prompts = torch.tensor(batch, device=rt.device)
    decoder = rt.engine.call(lambda: TorchGraphDecoder(rt.model, len(batch), max_len))

    def gen(n: int) -> Any:
        return rt.engine.call(lambda: decoder.generate(prompts, n))

    return gen
