"""Device KV pages: one (k, v) pair of [num_pages, page_size, K, H] arrays per layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from tgix.models.config import ModelConfig
from tgix.models.llama import LayerKV
from tgix.sharding.rules import kv_pages_sharding


def init_kv_pages(
    cfg: ModelConfig, num_pages: int, page_size: int, *, mesh: Mesh, dtype=jnp.float32
) -> tuple[LayerKV, ...]:
    """Zeroed pages placed with KV heads on the mesh's "model" axis. Page 0 is the null page."""
    shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    sharding = kv_pages_sharding(mesh)
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)
    return tuple(LayerKV(zeros(), zeros()) for _ in range(cfg.num_layers))


def kv_bytes_per_token(cfg: ModelConfig, dtype=jnp.float32) -> int:
    """Bytes of K and V that one token occupies across all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
