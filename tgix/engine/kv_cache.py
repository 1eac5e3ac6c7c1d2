"""Device KV pages: one LayerKV (k, v) per layer, each of the attention backend's kv_shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from tgix.attention.backend import AttentionBackend, backend
from tgix.attention.contract import LayerKV, storage_dtype
from tgix.models.config import ModelConfig
from tgix.sharding.rules import kv_pages_sharding


def init_kv_pages(
    cfg: ModelConfig,
    num_pages: int,
    page_size: int,
    *,
    mesh: Mesh,
    dtype=jnp.float32,
    attention: AttentionBackend | None = None,
) -> tuple[LayerKV, ...]:
    """Zeroed pages placed with KV heads on the mesh's "model" axis, in `attention`'s layout
    (None: the default backend's, [num_pages, page_size, K, H]). Page 0 is the null page."""
    attention = attention or backend()
    shape = attention.kv_shape(num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    sharding = kv_pages_sharding(mesh)
    dtype = storage_dtype(dtype)  # fp8: bytes (attention/contract.py)
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)
    return tuple(LayerKV(zeros(), zeros()) for _ in range(cfg.num_layers))


def kv_bytes_per_token(cfg: ModelConfig, dtype=jnp.float32) -> int:
    """Bytes of K and V that one token occupies across all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
