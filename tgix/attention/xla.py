"""The XLA paths of the "paged" backend: fresh-row prefill, paged decode, and the pieces the
mixed steps (xla_mixed.py) reuse.

prefill_attention  steps whose rows all start at 0: no page is read; block-sparse over the
                   step's own K/V (each query block reads key blocks from its row's start only)
paged_attention    any step (the decode path: one token per row): online softmax over page
                   chunks, the loop bounded by the longest row
Both equal reference_attention (tgix.attention.reference); softmax in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tgix.attention import online_softmax, shared_prefix
from tgix.attention.contract import MASKED, AttentionMetadata, read_pages, soft_cap


def prefill_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    md: AttentionMetadata,
    *,
    sliding_window: int | None = None,
    block: int | None = None,
    softcap: float | None = None,
) -> jax.Array:
    """Causal GQA among the step's own tokens, for steps whose rows all start at position 0.

    q [T, N, H]; k_new, v_new [T, K, H] (this step's K/V, before or after the page write);
    returns [T, N, H]. No page is read: a whole prompt is one row's contiguous span on T, and a
    token sees the earlier tokens of its own row. Padding tokens (index >= cu_q_lens[-1]) are
    never seen. Work is block-sparse over the packed axis (flash-attention's varlen form): a
    loop over query blocks of `block` tokens (default: by_longest_row), each running an online
    softmax over the key blocks from its first row's start to itself only. Cost follows the sum of
    the rows' squared lengths, not T squared: 48 prompts of 85 tokens in a 4096-token step
    touch 2 key blocks per query block where a dense triangle touched up to 16, and a single
    long prompt costs its causal triangle. Two loops per layer keep the executables small.
    """
    t, n, h = q.shape
    k = k_new.shape[1]
    fresh = lambda qb, start, q_blk, q_rows, q_pos: online_softmax.init(
        (k, n // k, q_blk.shape[2]), h
    )
    run = lambda b: causal_blocks(
        q, k_new, v_new, md, fresh, sliding_window=sliding_window, block=b, softcap=softcap
    )
    return run(block) if block else by_longest_row(md, t, run)


BLOCKS = (32, 256)  # query/key block sizes for steps of short rows and of long ones
SHORT_ROW = 256  # longest row (new tokens in the step) that still runs in small blocks


def block_sizes(t: int) -> tuple[int, int]:
    """The two block sizes for a T-token step (a block never exceeds T)."""
    return min(BLOCKS[0], t), min(BLOCKS[1], t)


def by_longest_row(md: AttentionMetadata, t: int, run):
    """run(block) with 32-token blocks when no row has more than SHORT_ROW new tokens, else
    256 (both compiled, one runs). A 256-token block of 80-token prompts computes mostly
    masked scores: measured per layer on XLA:CPU, 38 prompts of 80 tokens take 7.5 ms in
    32-token blocks and 19 ms in 256-token ones; one 4096-token prompt 155 ms and 99 ms."""
    small, large = block_sizes(t)
    if small == large:
        return run(large)
    longest = jnp.max(md.cu_q_lens[1:] - md.cu_q_lens[:-1])
    return jax.lax.cond(longest <= SHORT_ROW, lambda: run(small), lambda: run(large))


def heads_first(x: jax.Array, shape: tuple[int, ...], pad: int) -> jax.Array:
    """[T, ...] -> float32 [*shape[:-1], T + pad, shape[-1]]: the token axis padded and moved
    next to the head dim, the KV head leading (batched matmuls)."""
    x = x.astype(jnp.float32).reshape(x.shape[0], *shape)
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * len(shape))
    return jnp.moveaxis(x, 0, -2)


def scaled_query_heads(q: jax.Array, num_kv_heads: int, pad: int) -> jax.Array:
    """q [T, N, H] -> [K, G, T + pad, H] scaled by H^-0.5, as every attention pass scores it."""
    t, n, h = q.shape
    return heads_first(q, (num_kv_heads, n // num_kv_heads, h), pad) * h**-0.5


def causal_blocks(
    q, k_new, v_new, md: AttentionMetadata, block_init, *, sliding_window, block, softcap=None
):
    """prefill_attention's loop, starting each query block from `block_init(qb, start, q_blk
    [K, G, Q, H] (scaled), q_rows [Q], q_pos [Q])`: a softmax carry ([K, G, Q] max and
    denominator, [K, G, Q, H] sum) that may already hold attention to earlier KV (paged
    history, see xla_mixed). Returns [T, N, H]."""
    t, n, h = q.shape
    block = min(block or 256, t)
    num_blocks = -(-t // block)
    pad = num_blocks * block - t
    k = k_new.shape[1]
    q_heads = scaled_query_heads(q, k, pad)  # [K, G, T', H]
    k_heads, v_heads = heads_first(k_new, (k, h), pad), heads_first(v_new, (k, h), pad)
    rows = jnp.pad(md.token_rows, (0, pad))
    pos = jnp.pad(md.positions, (0, pad))
    real = jnp.arange(t + pad, dtype=jnp.int32) < md.cu_q_lens[-1]  # [T']
    row_start = md.cu_q_lens[rows]  # [T'] first index of each token's row

    def query_block(qb, out):
        start = qb * block
        q_blk = jax.lax.dynamic_slice_in_dim(q_heads, start, block, 2)  # [K, G, Q, H]
        q_rows = jax.lax.dynamic_slice_in_dim(rows, start, block)
        q_pos = jax.lax.dynamic_slice_in_dim(pos, start, block)

        def key_block(kb, carry):  # carry: [K, G, Q] max and denominator, [K, G, Q, H] sum
            at = kb * block
            k_blk = jax.lax.dynamic_slice_in_dim(k_heads, at, block, 1)  # [K, S, H]
            v_blk = jax.lax.dynamic_slice_in_dim(v_heads, at, block, 1)
            k_rows = jax.lax.dynamic_slice_in_dim(rows, at, block)
            k_pos = jax.lax.dynamic_slice_in_dim(pos, at, block)
            valid = (q_rows[:, None] == k_rows[None, :]) & (k_pos[None, :] <= q_pos[:, None])
            valid &= jax.lax.dynamic_slice_in_dim(real, at, block)[None, :]  # [Q, S]
            if sliding_window is not None:
                valid &= k_pos[None, :] > q_pos[:, None] - sliding_window
            scores = soft_cap(jnp.einsum("kgqh,ksh->kgqs", q_blk, k_blk), softcap)
            scores = jnp.where(valid[None, None], scores, MASKED)
            return online_softmax.fold(carry, scores, v_blk, "kgqs,ksh->kgqh")

        # a block that starts in padding reads nothing; else from its first row's start
        first = jnp.where(real[start], row_start[start] // block, qb + 1)
        init = block_init(qb, start, q_blk, q_rows, q_pos)
        _, denom, acc = jax.lax.fori_loop(first, qb + 1, key_block, init)
        blk = online_softmax.result(denom, acc)
        return jax.lax.dynamic_update_slice_in_dim(out, blk, start, 2)

    out = jax.lax.fori_loop(0, num_blocks, query_block, jnp.zeros_like(q_heads))
    out = jnp.moveaxis(out[:, :, :t], -2, 0)  # [T, K, G, H]
    return out.reshape(t, n, h).astype(q.dtype)


def paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    md: AttentionMetadata,
    *,
    sliding_window: int | None = None,
    chunk_pages: int = 8,
    softcap: float | None = None,
) -> jax.Array:
    """The reference's result, computed chunk by chunk with an online softmax (flash-decoding).

    q [T, N, H]; pages [num_pages, page_size, K, H]; returns [T, N, H]. A while loop walks
    the page table `chunk_pages` pages at a time and stops after the longest row in the step,
    so cost follows the actual KV lengths, not the page table's static width P: one compiled
    step serves short and long sequences alike, and memory is O(T * chunk * K * H). Pages
    the rows share (md.shared_pages) are read once for all of them (shared_prefix), and each
    row's own loop starts after them.
    """
    t, n, h = q.shape
    k = k_pages.shape[2]
    pad = -md.page_table.shape[1] % chunk_pages
    page_table = jnp.pad(md.page_table, ((0, 0), (0, pad)))  # [R, P'] with P' % chunk == 0
    # a token sees positions up to its own and below its row's KV length
    limit = jnp.minimum(md.positions + 1, md.kv_lens[md.token_rows])[:, None]  # [T, 1]
    q_grouped = q.reshape(t, k, n // k, h).astype(jnp.float32) * h**-0.5
    skip_rows = shared_prefix.first_pages(md, sliding_window)  # [R] or None
    skip = None if skip_rows is None else skip_rows[md.token_rows]  # [T]
    carry = token_pages(
        q_grouped,
        k_pages,
        v_pages,
        page_table[md.token_rows],
        limit,
        md.positions,
        jnp.max(md.kv_lens if skip is None else limit[:, 0] - skip * k_pages.shape[1]),
        chunk_pages=chunk_pages,
        sliding_window=sliding_window,
        softcap=softcap,
        skip=skip,
    )
    if skip is not None:
        q_heads = jnp.moveaxis(q_grouped, 0, 2)  # [K, G, T, H]
        real = md.cu_q_lens[-1]
        shared = shared_prefix.shared_prefix_carry(q_heads, k_pages, v_pages, md, real, softcap)
        carry = online_softmax.merge(carry, tuple(jnp.moveaxis(x, 2, 0) for x in shared))
    out = online_softmax.result(*carry[1:])  # 0 only for empty padding rows
    return out.reshape(t, n, h).astype(q.dtype)


def token_pages(
    q_grouped, k_pages, v_pages, pages_of_token, limit, q_pos, longest, *, chunk_pages,
    sliding_window, softcap=None, skip=None,
):  # fmt: skip
    """Each token's own row pages, gathered per token `chunk_pages` pages at a time, folded
    into an online softmax: q_grouped [S, K, G, H] (scaled), pages_of_token [S, P'] (P' a
    multiple of chunk_pages), limit [S, 1] (positions below it are seen), q_pos [S],
    `longest` the loop bound in positions (past the skipped ones). `skip` [S] (or None): the
    leading pages each token leaves out (a shared prefix read by another pass). Returns the
    carry: max and denominator [S, K, G], sum [S, K, G, H]. Shared by paged_attention and
    xla_mixed's per-token pass."""
    s, k, g, h = q_grouped.shape
    chunk = chunk_pages * k_pages.shape[1]
    first = 0 if skip is None else skip[:, None] * k_pages.shape[1]  # [S, 1] first position
    offsets = jnp.arange(chunk_pages, dtype=jnp.int32)[None, :]
    widest = pages_of_token.shape[1] - 1

    def body(i, carry):
        if skip is None:
            pages = jax.lax.dynamic_slice_in_dim(pages_of_token, i * chunk_pages, chunk_pages, 1)
        else:  # pages past a row's end are masked below (kv_pos >= limit)
            index = jnp.minimum(skip[:, None] + i * chunk_pages + offsets, widest)
            pages = jnp.take_along_axis(pages_of_token, index, axis=1)  # [S, chunk_pages]
        k_c = read_pages(k_pages, pages).reshape(s, chunk, k, h)  # [S, C, K, H] float32
        v_c = read_pages(v_pages, pages).reshape(s, chunk, k, h)
        scores = soft_cap(jnp.einsum("tkgh,tckh->tkgc", q_grouped, k_c), softcap)
        kv_pos = first + i * chunk + jnp.arange(chunk, dtype=jnp.int32)[None, :]  # [S | 1, C]
        valid = kv_pos < limit  # [S, C]
        if sliding_window is not None:
            valid &= kv_pos > q_pos[:, None] - sliding_window
        scores = jnp.where(valid[:, None, None, :], scores, MASKED)
        return online_softmax.fold(carry, scores, v_c, "tkgc,tckh->tkgh")

    num_chunks = (longest + chunk - 1) // chunk
    return jax.lax.fori_loop(0, num_chunks, body, online_softmax.init((s, k, g), h))
