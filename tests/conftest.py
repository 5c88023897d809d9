"""Shared fixtures. The bundled model is loaded once per session (CPU, fp32); Hugging Face
transformers is the correctness oracle and is imported only here and in tests."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_gguf():
    from sgjit.runtime.loader.resolve import bundled_model_path

    return bundled_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def runtime():
    """The bundled model on CPU in fp32 as it serves by default (its 4/8-bit GGUF weights kept
    packed, sgjit's C++ kernels), shared by the tests that only read from it."""
    import sgjit

    rt = sgjit.Runtime(device="cpu", max_total_tokens=8192, seed=0)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="session")
def dense_runtime():
    """The bundled model with its weights dequantized to fp32 at load (quantization="none"): the
    path that matches transformers on the same dequantized weights to fp32 rounding."""
    import sgjit

    rt = sgjit.Runtime(device="cpu", max_total_tokens=4096, seed=0, quantization="none")
    yield rt
    rt.shutdown()


@pytest.fixture(scope="session")
def hf_model(bundled_gguf):
    from transformers import AutoModelForCausalLM

    from sgjit.bench.peers import fast_gguf_parsing

    with fast_gguf_parsing():
        return AutoModelForCausalLM.from_pretrained(
            str(bundled_gguf.parent), gguf_file=bundled_gguf.name, dtype=torch.float32
        ).eval()


@pytest.fixture(scope="session")
def hf_tokenizer(bundled_gguf):
    from transformers import AutoTokenizer

    from sgjit.bench.peers import fast_gguf_parsing

    with fast_gguf_parsing():
        return AutoTokenizer.from_pretrained(str(bundled_gguf.parent), gguf_file=bundled_gguf.name)


def assert_no_leaked_pages(rt) -> None:
    """After the engine is idle and the cache flushed, every page is free again."""
    rt.flush_cache()
    s = rt.stats()
    assert s["running"] == 0 and s["waiting"] == 0, s
    assert s["kv_pages_free"] == s["kv_pages_total"], s


GREEDY = {"temperature": 0.0}


# ----- a live server over the shared runtime, one per test module (tests/server/) -----
@pytest.fixture(scope="module")
def server(runtime):
    """The real app on a free port over the shared runtime; a module needing other server
    arguments defines its own `server`."""
    from server_harness import LiveServer

    srv = LiveServer(runtime)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    """The `openai` SDK pointed at `server`."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def tp_rank_pids(parent: int | None = None) -> list[int]:
    """Live tensor-parallel rank processes (`python -m sgjit.runtime.parallel`) started by `parent`
    (this process by default); zombies count as gone."""
    import os
    from pathlib import Path

    parent = os.getpid() if parent is None else parent
    pids = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, ...
        if fields[0] != "Z" and int(fields[1]) == parent and b"sgjit.runtime.parallel" in cmdline:
            pids.append(int(d.name))
    return pids


def wait_ended(pid: int, timeout: float = 30.0) -> bool:
    """Whether process `pid` ends within `timeout` seconds (a zombie counts: it runs nothing and its
    parent may not have reaped it yet)."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + timeout
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
