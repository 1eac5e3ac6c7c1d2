"""Model registry and loading: resolve files, read the config, build the decoder, place weights."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from tgix.models.checkpoint import CheckpointError, SafetensorsSource
from tgix.models.config import ModelConfig, UnsupportedModelError
from tgix.models.gguf import GGUFSource
from tgix.models.hub import ModelFiles, resolve_model
from tgix.models.llama import LayerKV, LlamaForCausalLM
from tgix.models.weights import load_weights
from tgix.sharding import check_fits, make_mesh

__all__ = [
    "CheckpointError",
    "LayerKV",
    "LoadedModel",
    "ModelConfig",
    "UnsupportedModelError",
    "build_model",
    "default_dtype",
    "load_model",
]

# Every supported model_type is a named switch of the Llama decoder.
ARCHITECTURES = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
}


def default_dtype():
    """float32 on CPU (XLA:CPU bf16 matmuls are ~30x slower), bfloat16 on GPU/TPU."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def build_model(
    cfg: ModelConfig, *, dtype=None, seed: int = 0, abstract: bool = False, attention="paged"
):
    """A decoder with random weights, or (abstract=True) its shapes only, allocating nothing."""
    cls = ARCHITECTURES[cfg.model_type]
    dtype = dtype or default_dtype()
    make = lambda: cls(cfg, rngs=nnx.Rngs(seed), dtype=dtype, attention=attention)
    return nnx.eval_shape(make) if abstract else make()


@dataclasses.dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    files: ModelFiles
    mesh: Mesh


def load_model(
    model_id: str | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    dtype=None,
    mesh: Mesh | None = None,
    attention: str = "paged",
) -> LoadedModel:
    """Load a checkpoint (folder, .gguf, Hub id; None = the embedded SmolLM2) onto `mesh`."""
    files = resolve_model(model_id, revision=revision, token=token, cache_dir=cache_dir)
    if files.kind == "gguf":
        source = GGUFSource(files.path)
        hf_config = source.hf_config()
    else:
        config_file = files.path / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{files.path} has no config.json")
        hf_config = json.loads(config_file.read_text())
        source = SafetensorsSource(files.path)
    cfg = ModelConfig.from_hf(hf_config)
    mesh = mesh or make_mesh()
    check_fits(cfg, mesh)
    dtype = jnp.dtype(dtype or default_dtype())  # accepts "bfloat16" etc.
    abstract = build_model(cfg, dtype=dtype, abstract=True, attention=attention)
    model = load_weights(abstract, cfg, source, mesh, dtype)
    return LoadedModel(model=model, config=cfg, files=files, mesh=mesh)
