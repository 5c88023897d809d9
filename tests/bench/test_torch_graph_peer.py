"""The torch+graph peer computes sgjit's model: on the same weights (a small real-width model, fp32,
CPU, where its decode steps run eagerly instead of as a graph) its greedy tokens are the reference
model's, and its logits agree; and the latency benchmark runs it as an engine."""

from __future__ import annotations

import json

import torch
from model_steps import Side

from sgjit.bench.torch_graph_peer import TorchGraphDecoder
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.model.llama import LlamaModel
from sgjit.runtime.model.presets import random_weights, shape_config


def test_peer_decodes_what_the_model_decodes():
    cfg = shape_config("smollm2-135m", 2)
    weights = random_weights(cfg, seed=1, std=0.1)
    model = LlamaModel(cfg, weights, REFERENCE_OPS, torch.device("cpu"), torch.float32, max_positions=128)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, cfg.vocab_size, (9,), generator=g).tolist() for _ in range(2)]
    side = Side(model, REFERENCE_OPS, rows=2, max_tokens=32)
    seqs = [list(p) for p in prompts]
    logits = side.step(seqs, [0, 0])
    for _ in range(5):
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.append(t)
        logits = side.step(seqs, starts)
    peer = TorchGraphDecoder(model, batch=2, max_len=32)
    for n in (1, 5):  # each call starts afresh from the prompt
        last = peer.generate(torch.tensor(prompts), n)[:, 0].tolist()
        assert last == [s[len(p) + n - 1] for s, p in zip(seqs, prompts)]
    peer_logits = peer._forward(peer.tokens, peer.pos, decode=True)
    torch.testing.assert_close(peer_logits, logits, rtol=1e-4, atol=1e-4)


def test_latency_bench_runs_the_peer(tmp_path):
    from sgjit.bench import latency

    out = tmp_path / "latency.json"
    latency.main(["--smoke", "--device", "cpu", "--engines", "sgjit", "torch-graph", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["engine"] for r in rows} == {"sgjit", "torch-graph"}
    assert all(r["decode_tok_s_per_seq"] > 0 for r in rows)
    assert all(r["decode_vs_torch_graph"] > 0 for r in rows if r["engine"] == "sgjit")
