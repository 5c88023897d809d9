"""SGLang's own frontend and test programs, loaded for sgjit's compatibility tests.

`sglang/__init__.py` pulls in SGLang's server stack (torch, triton, FlashInfer), which these tests
neither have nor need; so the package is bound as a bare module over its real directory, and the
frontend modules (`sglang.lang.*`) are imported from it directly. `frontend()` gives SGLang's
frontend API (what `import sglang as sgl` gives a client), and `load_test_programs(sgl, ...)` loads SGLang's
`sglang/test/test_programs.py` unchanged, with `sglang` bound to the API under test: SGLang's own
frontend (programs then run through SGLang's `RuntimeEndpoint` against `sgjit serve`) or sgjit
itself (programs run in process, as after `import sgjit as sgl`)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

FRONTEND_NAMES = (
    "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string",
    "get_server_info", "image", "select", "set_default_backend", "system", "system_begin", "system_end", "user",
    "user_begin", "user_end", "video",
)  # fmt: skip


@functools.cache
def sglang_dir() -> Path | None:
    """Where the sglang package is installed (found without running its __init__), or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _bare_package(name: str, path: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)]  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module


def frontend() -> types.ModuleType:
    """SGLang's frontend API as `import sglang as sgl` would give it, from the installed package."""
    root = sglang_dir()
    assert root is not None, "sglang is not installed"
    existing = sys.modules.get("sglang")
    if existing is not None and getattr(existing, "RuntimeEndpoint", None) is not None:
        return existing
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    sgl = _bare_package("sglang", root)
    api = importlib.import_module("sglang.lang.api")
    for name in FRONTEND_NAMES:
        setattr(sgl, name, getattr(api, name))
    sgl.RuntimeEndpoint = importlib.import_module("sglang.lang.backend.runtime_endpoint").RuntimeEndpoint
    sgl.global_config = importlib.import_module("sglang.lang.global_config").global_config
    return sgl


def sglang_regexes() -> dict[str, str]:
    """SGLang's dtype regexes (sglang.lang.ir), which one test program imports by name."""
    ir = importlib.import_module("sglang.lang.ir") if "sglang.lang.ir" in sys.modules else None
    if ir is None:
        frontend()
        ir = importlib.import_module("sglang.lang.ir")
    return {k: getattr(ir, k) for k in ("REGEX_INT", "REGEX_FLOAT", "REGEX_BOOL", "REGEX_STR")}


def load_test_programs(sgl: Any, get_tokenizer: Any, modules: dict[str, Any]) -> types.ModuleType:
    """SGLang's test_programs.py with `sglang` bound to `sgl`. `modules` (a dict like sys.modules,
    e.g. pytest's monkeypatch target) receives the few modules it imports besides the frontend:
    `sglang.srt.utils.is_hip` (no ROCm here), `get_tokenizer` for its min-token check, and
    `sglang.lang.ir`'s regexes."""
    root = sglang_dir()
    assert root is not None, "sglang is not installed"
    regexes = sglang_regexes()
    srt = types.ModuleType("sglang.srt")
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_hip = lambda: False  # type: ignore[attr-defined]
    hf = types.ModuleType("sglang.srt.utils.hf_transformers_utils")
    hf.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    ir = types.ModuleType("sglang.lang.ir")
    ir.__dict__.update(regexes)
    lang = types.ModuleType("sglang.lang")
    lang.ir = ir  # type: ignore[attr-defined]
    modules.update({"sglang": sgl, "sglang.srt.utils": utils, "sglang.srt.utils.hf_transformers_utils": hf})
    for name, stub in (("sglang.srt", srt), ("sglang.lang", lang), ("sglang.lang.ir", ir)):
        if sgl.__name__ != "sglang" or name not in modules:  # the real frontend keeps its own modules
            modules[name] = stub
    path = root / "test" / "test_programs.py"
    spec = importlib.util.spec_from_file_location("sglang_test_programs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
