"""Resolving model ids: local folders and files, the embedded default, the Hub (mocked: no
network here), and the refusal of pickled checkpoints."""

import huggingface_hub
import pytest

from tgix.models import CheckpointError, load_model
from tgix.models.hub import resolve_model


@pytest.fixture
def fake_hub(monkeypatch, tiny_checkpoints):
    """A Hub with one safetensors repo and one pickle-only repo; records download calls."""
    repos = {
        "org/tiny": ["config.json", "model.safetensors", "tokenizer.json", "pytorch_model.bin"],
        "org/old": ["config.json", "pytorch_model.bin", "tokenizer.json"],
    }
    calls = []

    def list_repo_files(self, repo_id, revision=None, **kwargs):
        return repos[repo_id]

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tiny_checkpoints("llama"))

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_hub_download_fetches_safetensors_only(fake_hub):
    loaded = load_model("org/tiny", revision="abc123", token="hf_x", cache_dir="/tmp/hub")
    assert loaded.config.num_layers == 3
    ((repo, kwargs),) = fake_hub
    assert repo == "org/tiny"
    assert (kwargs["revision"], kwargs["token"], kwargs["cache_dir"]) == (
        "abc123",
        "hf_x",
        "/tmp/hub",
    )
    assert "*.safetensors" in kwargs["allow_patterns"]
    assert not any(p.endswith((".bin", ".pt")) for p in kwargs["allow_patterns"])


def test_pickle_only_hub_repo_is_refused_before_download(fake_hub):
    with pytest.raises(CheckpointError, match=r"only pickled weights \(pytorch_model\.bin\)"):
        resolve_model("org/old")
    assert fake_hub == []


def test_local_and_default_resolution(tiny_checkpoints, tmp_path):
    assert resolve_model(str(tiny_checkpoints("llama"))).kind == "safetensors"
    default = resolve_model(None)
    assert default.kind == "gguf" and default.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == default
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not .gguf"):
        resolve_model(str(tmp_path / "weights.txt"))
