"""tgix: a TGI-compatible LLM serving engine on JAX/XLA.

The engine library lives here (models, sharding, engine); the HTTP app lives in `server/`.
"""

from tgix.models import LoadedModel, ModelConfig, build_model, load_model
from tgix.tokenizer import Tokenizer, load_tokenizer

__version__ = "0.1.0"
__all__ = ["LoadedModel", "ModelConfig", "Tokenizer", "build_model", "load_model", "load_tokenizer"]
