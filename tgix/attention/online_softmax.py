"""Flash attention's online softmax: a running max, denominator and weighted sum that key
blocks fold into one at a time, in any order, and that two passes over disjoint keys merge.

A carry is (max [*Q], denominator [*Q], sum [*Q, H]) for query shape Q. Scores masked with
contract.MASKED (finite) leave a carry that saw nothing with a uniform average of the masked
values; the first real score's rescaling (exp(MASKED - max) = 0) wipes it out, so only a
query that sees no key at all (padding) keeps it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tgix.attention.contract import MASKED


def init(shape: tuple[int, ...], head_dim: int):
    """The carry of queries of `shape` that have seen nothing."""
    return (
        jnp.full(shape, MASKED, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros((*shape, head_dim), jnp.float32),
    )


def fold(carry, scores: jax.Array, values: jax.Array, spec: str):
    """Fold one block of masked scores [..., S] and its values into the carry (rescaling
    what it holds by exp(old max - new max)); `spec` contracts probabilities with values."""
    m, denom, acc = carry
    m_new = jnp.maximum(m, scores.max(-1))
    probs = jnp.exp(scores - m_new[..., None])
    scale = jnp.exp(m - m_new)
    denom = denom * scale + probs.sum(-1)
    return m_new, denom, acc * scale[..., None] + jnp.einsum(spec, probs, values)


def merge(a, b):
    """Two carries of the same queries over disjoint keys, as if one pass saw both."""
    (ma, da, sa), (mb, db, sb) = a, b
    m = jnp.maximum(ma, mb)
    wa, wb = jnp.exp(ma - m), jnp.exp(mb - m)
    return m, da * wa + db * wb, sa * wa[..., None] + sb * wb[..., None]


def result(denom: jax.Array, acc: jax.Array) -> jax.Array:
    """The attention output [*Q, H]: the weighted sum over the denominator."""
    return acc / jnp.maximum(denom, 1e-30)[..., None]  # 0 only for queries that saw nothing
