"""The correctness oracle: masked GQA over each token's row of pages, in pure jnp."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tgix.attention.contract import MASKED, AttentionMetadata, read_pages, soft_cap


def reference_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    md: AttentionMetadata,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> jax.Array:
    """Masked GQA over each token's row of pages, softmax in float32: the correctness oracle.

    q [T, N, H]; k_pages, v_pages [num_pages, page_size, K, H] (already holding this step's
    K/V); returns [T, N, H] in q's dtype. Memory is O(T * S * K * H) with S = P * page_size,
    fine for tests and small steps; kernel backends replace it where speed matters.
    """
    t, n, h = q.shape
    _, page_size, k, _ = k_pages.shape
    g = n // k
    pages_of_token = md.page_table[md.token_rows]  # [T, P]
    s = pages_of_token.shape[1] * page_size
    k_tok = read_pages(k_pages, pages_of_token).reshape(t, s, k, h)  # [T, S, K, H]
    v_tok = read_pages(v_pages, pages_of_token).reshape(t, s, k, h)  # [T, S, K, H]
    q_grouped = q.reshape(t, k, g, h).astype(jnp.float32)
    scores = jnp.einsum("tkgh,tskh->tkgs", q_grouped, k_tok.astype(jnp.float32)) * h**-0.5
    scores = soft_cap(scores, softcap)

    kv_pos = jnp.arange(s, dtype=jnp.int32)[None, :]  # [1, S]
    q_pos = md.positions[:, None]  # [T, 1]
    valid = (kv_pos <= q_pos) & (kv_pos < md.kv_lens[md.token_rows][:, None])  # [T, S]
    if sliding_window is not None:
        valid &= kv_pos > q_pos - sliding_window  # transformers: kv > q - window
    scores = jnp.where(valid[:, None, None, :], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1)  # [T, K, G, S] float32
    out = jnp.einsum("tkgs,tskh->tkgh", probs, v_tok.astype(jnp.float32))
    return out.reshape(t, n, h).astype(q.dtype)


def own_token_pages(k_new: jax.Array, v_new: jax.Array, md: AttentionMetadata):
    """A fresh step's own K/V [T, K, H] as T one-token pages, each row's page table pointing at
    its span of T, for a step packed without pages (every row starts at 0, so all its KV is in
    the step). Returns k_pages, v_pages [T, 1, K, H] and md with page_table [R, T]."""
    t = k_new.shape[0]
    spans = md.cu_q_lens[:-1, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [R, T]
    md = dataclasses.replace(md, page_table=jnp.minimum(spans, t - 1))
    return k_new[:, None], v_new[:, None], md
