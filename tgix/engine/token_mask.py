"""Grammar masks on device: packed allowed-token bits [R, W] uint32 (bit t % 32 of word
t // 32 allows token t) applied to logits [R, V] before sampling, as its own small executable
per R so the sampler's executables stay as they are. Rows without a grammar send all-ones
words. Shifts rather than a byte bitcast: the same result on any endianness."""

from __future__ import annotations

import jax
import jax.numpy as jnp

ALL_ALLOWED = 0xFFFFFFFF


def apply_token_mask(logits: jax.Array, packed: jax.Array) -> jax.Array:
    """logits [R, V] float, packed [R, W] uint32 with W * 32 >= V -> logits with disallowed
    tokens at -inf."""
    rows, vocab = logits.shape
    shifts = jnp.arange(32, dtype=jnp.uint32)
    bits = (packed[:, :, None] >> shifts) & jnp.uint32(1)  # [R, W, 32]
    allowed = bits.reshape(rows, -1)[:, :vocab].astype(bool)
    return jnp.where(allowed, logits, jnp.asarray(-jnp.inf, logits.dtype))
