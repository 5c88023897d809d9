"""DeepSeek-V4's forward against transformers' on a tiny random model (tiny_deepseek_v4.py), float32 on
the CPU, straight through the model over its paged cache (no engine): one prefill, prefills cut into
chunks at any position followed by token-by-token decoding, rows of different kinds in one step,
and a sequence that resumes from another's cached pages, at page sizes below, between and above
the compress rates (4 and 8). Every logit must agree to 1e-4 (they are of order 5). In bfloat16 the
model must stay as close to transformers' float32 logits as transformers' own bfloat16 run does."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_deepseek_v4 import save_tiny_v4

from sgjit.kernels.ops import AttentionMetadata
from sgjit.kernels.reference import REFERENCE_OPS
from sgjit.runtime.forward_batch import ForwardBatch
from sgjit.runtime.loader import load_checkpoint
from sgjit.runtime.model.deepseek_v4.cache import DeepseekV4KVPool
from sgjit.runtime.model.deepseek_v4.model import DeepseekV4Model

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, runtime):
    """(directory, the transformers model) of the tiny DeepSeek-V4, with the bundled tokenizer."""
    path = tmp_path_factory.mktemp("dsv4") / "tiny-v4"
    backend = runtime.tokenizer.backend
    return path, save_tiny_v4(path, backend.get_vocab_size(), backend)


class Paged:
    """The model and a pool of `page_size` pages, fed rows of (tokens, start, end, pages)."""

    def __init__(self, path, page_size: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        ckpt = load_checkpoint(path)
        dev = torch.device(device)
        self.model = DeepseekV4Model(ckpt.config, ckpt.weights, REFERENCE_OPS, dev, dtype)
        self.pool = DeepseekV4KVPool(ckpt.config.deepseek_v4, ckpt.config.head_dim, 64, page_size, dtype, dev)
        self.ps, self.device = page_size, dev

    def pages(self, num_tokens: int) -> list[int]:
        return self.pool.allocator.alloc(self.pool.pages_for(num_tokens))

    def step(self, rows: list[tuple[list[int], int, int, list[int]]]) -> list[torch.Tensor]:
        """Each row's logits at every position it computed this step."""
        ps, ids, pos, slots, qo, lens = self.ps, [], [], [], [0], []
        table = torch.zeros(len(rows), max(len(r[3]) for r in rows), dtype=torch.int32)
        for b, (tokens, start, end, pages) in enumerate(rows):
            ids += tokens[start:end]
            pos += range(start, end)
            slots += [pages[p // ps] * ps + p % ps for p in range(start, end)]
            qo.append(len(ids))
            lens.append(end)
            table[b, : len(pages)] = torch.tensor(pages)
        t = {"device": self.device}
        meta = AttentionMetadata(
            torch.tensor(qo, dtype=torch.int32, **t), torch.tensor(lens, dtype=torch.int32, **t), table.to(**t),
            ps, max(b - a for a, b in zip(qo, qo[1:])), max(lens), qo, lens,
        )  # fmt: skip
        batch = ForwardBatch(
            torch.tensor(ids, **t),
            torch.tensor(pos, **t),
            torch.tensor(slots, **t),
            meta,
            torch.arange(len(ids), **t),
        )
        logits = self.model.forward(batch, self.pool.layers).cpu()
        return [logits[a:b] for a, b in zip(qo, qo[1:])]


def reference(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def sequence(n: int, seed: int, vocab: int = 5000) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_matches_transformers(tiny):
    path, hf = tiny
    paged = Paged(path, page_size=16)
    tokens = sequence(45, 0)
    (logits,) = paged.step([(tokens, 0, 45, paged.pages(45))])
    assert (logits - reference(hf, tokens)).abs().max().item() < TOL


@pytest.mark.parametrize("page_size", [4, 8, 32])
def test_chunks_then_decode_match_transformers(tiny, page_size):
    """Chunks end inside compress windows, on their ends and on page ends; decoding crosses
    window and page ends, finishing HCA entries (every 8 tokens) and CSA entries (every 4)."""
    path, hf = tiny
    paged = Paged(path, page_size)
    tokens = sequence(50, 1)
    pages = paged.pages(50)
    got = []
    for start, end in [(0, 13), (13, 16), (16, 30)] + [(p, p + 1) for p in range(30, 50)]:
        got += paged.step([(tokens, start, end, pages)])
    assert (torch.cat(got) - reference(hf, tokens)).abs().max().item() < TOL


def test_mixed_batch_and_a_resumed_prefix_match_transformers(tiny):
    """Prefill chunks and decode rows share steps; then a sequence whose first 32 tokens are another's
    starts from that one's pages (what the radix cache hands over) and computes only the rest."""
    path, hf = tiny
    paged = Paged(path, page_size=8)
    a, c = sequence(45, 2), sequence(9, 3)
    b = a[:32] + sequence(20, 4)
    pa, pc = paged.pages(45), paged.pages(9)
    got_a, got_c = [], []
    for (a0, a1), (c0, c1) in [((0, 20), (0, 5)), ((20, 38), (5, 6)), ((38, 39), (6, 7)), ((39, 40), (7, 9))]:
        la, lc = paged.step([(a, a0, a1, pa), (c, c0, c1, pc)])
        got_a.append(la)
        got_c.append(lc)
    for p in range(40, 45):
        got_a += paged.step([(a, p, p + 1, pa)])
    pb = pa[:4] + paged.pages(52 - 32)
    (got_b,) = paged.step([(b, 32, 52, pb)])
    assert (torch.cat(got_a) - reference(hf, a)).abs().max().item() < TOL
    assert (torch.cat(got_c) - reference(hf, c)).abs().max().item() < TOL
    assert (got_b - reference(hf, b)[32:]).abs().max().item() < TOL


def test_the_tiny_model_exercises_what_it_should(tiny):
    """The indexer must pick among more finished entries than it keeps, and the SwiGLU clip bind."""
    path, hf = tiny
    cfg = hf.config
    assert {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"} <= set(
        cfg.layer_types
    )
    assert 45 // cfg.compress_rates["compressed_sparse_attention"] > cfg.index_topk
    gate_up = []
    hook = hf.model.layers[2].mlp.shared_experts.gate_proj.register_forward_hook(
        lambda m, i, o: gate_up.append(o)
    )
    reference(hf, sequence(45, 0))
    hook.remove()
    assert (gate_up[0] > cfg.swiglu_limit).any()


def check_bfloat16(path, hf, device: str, vocab: int = 5000) -> None:
    """bfloat16 on `device`, prefilled in chunks then decoded, against transformers' float32 logits:
    per position, the largest error must typically (median, 80th percentile) be no worse than
    transformers' own bfloat16 run on the same device; a few positions may differ more where a
    near-tie in routing or in the indexer's top-k went the other way; the argmax mostly agrees."""
    tokens = sequence(45, 6, vocab)
    exact = reference(hf, tokens)
    with torch.no_grad():
        hf16 = copy.deepcopy(hf).to(device=device, dtype=torch.bfloat16)
        theirs = hf16(torch.tensor([tokens], device=device)).logits[0].float().cpu()
    paged = Paged(path, page_size=8, dtype=torch.bfloat16, device=device)
    pages = paged.pages(45)
    steps = [(0, 13), (13, 30)] + [(p, p + 1) for p in range(30, 45)]
    ours = torch.cat([paged.step([(tokens, a, b, pages)])[0] for a, b in steps]).float()
    err_ours, err_theirs = ((x - exact).abs().amax(dim=-1) for x in (ours, theirs))
    for q in (0.5, 0.8):
        assert err_ours.quantile(q) <= 1.5 * err_theirs.quantile(q) + 0.05, (q, err_ours, err_theirs)
    assert (ours.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.8


def test_bfloat16_tracks_transformers(tiny):
    check_bfloat16(*tiny, device="cpu")
