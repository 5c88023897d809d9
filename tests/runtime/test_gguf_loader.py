"""The GGUF loader on tiny files written in the test: tensors dequantized, llama.cpp's Q/K permutation
undone, tokenizer built from the file's vocabulary."""

from __future__ import annotations

import pytest
import torch

import sgjit

from tiny_gguf import CONTROL_ID, tiny_hf_llama, write_tiny_gguf


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-4), ("F16", 5e-2), ("Q8_0", 0.2)])
def test_tiny_gguf_matches_source_model(tmp_path, qtype, tol):
    hf = tiny_hf_llama(259)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", hf, qtype=qtype)
    rt = sgjit.Runtime(str(path), device="cpu", max_total_tokens=512)
    try:
        ids = rt.tokenizer.encode("hello, tiny world!")
        assert ids == list(b"hello, tiny world!")  # no merges: one token per byte, id = byte
        out = rt.generate(
            input_ids=ids,
            sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
        )
        ours = torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]])
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
        ref = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert (ours - ref).abs().max().item() < tol
        if qtype == "F32":
            with torch.no_grad():
                greedy = hf.generate(
                    torch.tensor([ids]),
                    max_new_tokens=8,
                    do_sample=False,
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                )
            assert out["output_ids"] == greedy[0, len(ids) :].tolist()
        assert rt.tokenizer.encode("<|im_start|>x")[0] == CONTROL_ID["<|im_start|>"]
    finally:
        rt.shutdown()


def test_reader_over_a_plain_view_reads_what_gguf_reads(tmp_path):
    """The loader's reader (gguf's, over a plain ndarray view of the memory map, not np.memmap
    slices) gives the same metadata and tensor bytes as gguf.GGUFReader, and does run on the plain
    view (were gguf to stop assigning `data`, loads would silently slow down again)."""
    import gguf
    import numpy as np

    from sgjit.runtime.loader.gguf_loader import _open

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_hf_llama(259), qtype="Q8_0")
    ours, theirs = _open(path), gguf.GGUFReader(path)
    assert type(ours.data) is np.ndarray and type(ours.tensors[0].data) is np.ndarray
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        a, b = ours.fields[key].contents(), field.contents()
        assert np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b, key
    assert [(t.name, t.tensor_type, list(t.shape)) for t in ours.tensors] == [
        (t.name, t.tensor_type, list(t.shape)) for t in theirs.tensors
    ]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, theirs.tensors))


def test_a_file_is_parsed_once_while_it_stays_the_same(tmp_path):
    """Runtimes of one process share the parsed file; a file written again (another size or time)
    is parsed again, so a reload never sees the old one."""
    from sgjit.runtime.loader.gguf_loader import _open, load_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_hf_llama(259), qtype="F32")
    first = _open(path)
    assert _open(path) is first and _open(tmp_path / "." / "tiny.gguf") is first
    write_tiny_gguf(path, tiny_hf_llama(259), qtype="F16")
    second = _open(path)
    assert second is not first
    assert {t.tensor_type.name for t in second.tensors if len(t.shape) == 2} >= {"F16"}
    assert "F16" not in {t.tensor_type.name for t in first.tensors}
    assert load_gguf(path).config.vocab_size == 259
