"""tgix: a TGI-compatible LLM serving engine on JAX/XLA.

The engine library lives here (models, sharding, engine); the HTTP app lives in `server/`.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Exports load on first use, so host-only modules (tgix.engine.scheduler, server/) can be
# imported without pulling in jax.
_EXPORTS = {
    "LLM": "tgix.llm",
    "generate": "tgix.generation",
    "LoadedModel": "tgix.models",
    "ModelConfig": "tgix.models",
    "build_model": "tgix.models",
    "load_model": "tgix.models",
    "Tokenizer": "tgix.tokenizer",
    "load_tokenizer": "tgix.tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tgix' has no attribute {name!r}")
