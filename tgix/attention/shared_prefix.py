"""The step's shared prefix, read once: history pages that several decode rows' tables begin with.

Prefix caching gives every turn of a chat over one system prompt the same physical pages, so
a decode step of 8 such rows would gather the same ~1,000 cached positions once per row.
`pack.shared_prefix_pages` finds the pages the leading decode rows share
(AttentionMetadata.shared_pages: the count, per row, 0 outside the group); this pass scores
those rows' tokens against them in one batched einsum a chunk, and xla.paged_attention's
per-token loop starts after them (mixed steps keep their own passes; BENCHMARKS.md). The
carries merge in any order (online softmax), so the result is unchanged.
Sliding-window models do not use it (a window would mask most of a long prefix anyway).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tgix.attention import online_softmax
from tgix.attention.contract import MASKED, AttentionMetadata, read_pages, soft_cap

CHUNK_PAGES = 16  # pages a loop iteration reads (scores [K, G, T, 16 x page_size] at once)


def first_pages(md: AttentionMetadata, sliding_window: int | None) -> jax.Array | None:
    """[R] pages each row's own passes skip (read by shared_prefix_carry), or None when
    the step has no shared pass: no metadata for it, a sliding window, or a one-row shape
    (a decode step at concurrency 1 keeps the plain loop, without the pass's few ops)."""
    if md.shared_pages is None or sliding_window is not None or md.kv_lens.shape[0] < 2:
        return None
    return md.shared_pages


def shared_prefix_carry(q_heads, k_pages, v_pages, md: AttentionMetadata, upto, softcap=None):
    """Online-softmax carry of the step's first S tokens over the shared pages: q_heads
    [K, G, S, H] (scaled), `upto` (traced) the tokens [0, upto) that may read them; returns
    max and denominator [K, G, S] and the weighted sum [K, G, S, H]. Tokens of rows outside
    the group, from upto on, get the empty carry (max MASKED, 0, 0). The loop runs
    ceil(count / CHUNK_PAGES) times: none when nothing is shared."""
    k, g, s, h = q_heads.shape
    page_size = k_pages.shape[1]
    count = jnp.max(md.shared_pages)  # every nonzero entry is this count
    owner = jnp.argmax(md.shared_pages)  # a row of the group: its table starts with them
    table = jnp.pad(md.page_table[owner], (0, CHUNK_PAGES))  # a last chunk may pass its end
    index = jnp.arange(s, dtype=jnp.int32)
    member = (index < upto) & (md.shared_pages[md.token_rows[:s]] > 0)  # [S]
    size = CHUNK_PAGES * page_size
    end = count * page_size  # positions [0, end) are shared

    def chunk(i, carry):
        ids = jax.lax.dynamic_slice_in_dim(table, i * CHUNK_PAGES, CHUNK_PAGES)
        k_c = jnp.moveaxis(read_pages(k_pages, ids).reshape(size, k, h), 1, 0)  # [K, C, H]
        v_c = jnp.moveaxis(read_pages(v_pages, ids).reshape(size, k, h), 1, 0)
        scores = soft_cap(jnp.einsum("kgqh,kch->kgqc", q_heads, k_c), softcap)
        kv_pos = i * size + jnp.arange(size, dtype=jnp.int32)
        valid = member[:, None] & (kv_pos < end)[None, :]  # [S, C]
        scores = jnp.where(valid[None, None], scores, MASKED)
        return online_softmax.fold(carry, scores, v_c, "kgqc,kch->kgqh")

    num_chunks = (count + CHUNK_PAGES - 1) // CHUNK_PAGES
    m, denom, acc = jax.lax.fori_loop(0, num_chunks, chunk, online_softmax.init((k, g, s), h))
    # non-members saw only masked scores: give them the empty carry, not a uniform average
    return (
        jnp.where(member, m, MASKED),
        jnp.where(member, denom, 0.0),
        jnp.where(member[:, None], acc, 0.0),
    )
