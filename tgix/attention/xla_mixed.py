"""Attention for mixed steps: decode rows and prompt chunks packed on one token axis.

A chunked-prefill step holds decode rows (one token each, history in pages) and prompt chunks
(many tokens each, with history in pages only when a chunk continues a prompt that an earlier
step cut). `paged_attention` gathers every token's row pages: a 512-token chunk copies its
row's history 512 times, and a fresh prompt (no history) still pays for the gather of the
longest row in the step. Here a token's attention is three passes folded into one online
softmax carry:

  per token  the leading run of one-token rows (decode rows; the scheduler puts them first)
             gathers each token's pages, in sub-blocks (4, 8 or 16 tokens, by the run's
             length) that loop only as far as their own longest history: each row's pages
             are read once, as they must be
  per row    every later token: each row's history pages are read once per window of its
             tokens (WINDOWS: 16 to 256 queries, the smallest that holds them; a longer
             row loops over 256-token windows), whatever query blocks the row spans: in
             chunks of BIG_CHUNK_PAGES, then of chunk_pages for the rest (big_chunks)
  own        the step's own K/V, causal within the row (prefill_attention's block loop)

Every (token, earlier position) pair is seen by exactly one pass whatever the row order, so
the result is reference_attention's for any step; the split decides only the speed.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from tgix.attention import online_softmax
from tgix.attention.contract import MASKED, AttentionMetadata, read_pages, soft_cap
from tgix.attention.xla import (
    block_sizes,
    by_longest_row,
    causal_blocks,
    scaled_query_heads,
    token_pages,
)

SUB_BLOCKS = (4, 8, 16)  # tokens of the per-token pass that share one loop bound
# query windows of the per-row pass, smallest first. A window computes all its queries: with
# 64-query windows for chat turns of 30-40 new tokens past 1,150 cached positions, a step's
# attention took 1.1-1.7x its time with 32- or 48-query ones (BENCHMARKS.md, "Fifth run")
WINDOWS = (16, 32, 48, 64, 96, 128, 256)
# The per-row pass reads a row's history BIG_CHUNK_PAGES pages at a time, the rest (under
# BIG_SHARE of a big chunk) chunk_pages at a time. A chunk's loop iteration costs ~0.11 ms a
# layer beyond its positions (32-query window, default model), as much as ~90 positions:
# 1,200 cached positions took 10.4 ms a layer in 10 chunks of 8 pages for 4 chat turns of
# 30 tokens, 6.4 ms in one chunk of 80 (BENCHMARKS.md, "Sixth run")
BIG_CHUNK_PAGES = 80
BIG_SHARE = 0.6


def switch_by_size(sizes, n, branch, *operands):
    """branch(size, *operands) for the smallest of `sizes` (ascending, static) that holds n
    (traced), else the largest: each size is compiled, one runs (lax.switch)."""
    index = sum((n > s).astype(jnp.int32) for s in sizes[:-1])
    branches = [functools.partial(branch, s) for s in sizes]
    return jax.lax.switch(index, branches, *operands)


def big_chunks(hist, page_size: int, chunk_pages: int):
    """How the per-row pass reads `hist` (traced) history positions: (big chunks, the first
    page after them, small chunks of chunk_pages). A rest over BIG_SHARE of a big chunk takes
    one more big chunk, which may end past the history (masked) and past the row's pages
    (mixed_attention pads the page table to whole big chunks, which the last one never
    passes: it starts below the history's end)."""
    big = BIG_CHUNK_PAGES * page_size
    num_big = (hist + big - int(BIG_SHARE * big)) // big
    rest = jnp.maximum(hist - num_big * big, 0)
    small = chunk_pages * page_size
    return num_big, num_big * BIG_CHUNK_PAGES, (rest + small - 1) // small


def mixed_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    md: AttentionMetadata,
    *,
    sliding_window: int | None = None,
    block: int | None = None,
    chunk_pages: int = 8,
    softcap: float | None = None,
) -> jax.Array:
    """q [T, N, H]; k_new, v_new [T, K, H] (this step's K/V); pages [num_pages, page_size, K, H]
    (holding every row's history); returns [T, N, H], equal to reference_attention."""
    t = q.shape[0]
    page_size = k_pages.shape[1]
    blocks = (min(block, t),) if block else block_sizes(t)
    padded = max(-(-t // b) * b for b in blocks)  # T' of causal_blocks, either block size
    q_lens = md.cu_q_lens[1:] - md.cu_q_lens[:-1]  # [R] (0 for padding rows)
    history = md.kv_lens - q_lens  # [R] positions in pages before this step
    lead = jnp.sum(jnp.cumprod(q_lens == 1))  # tokens in the leading run of one-token rows
    real = md.cu_q_lens[-1]
    # a whole number of big chunks: the last one big_chunks takes may end past the row's pages
    pad = -md.page_table.shape[1] % math.lcm(chunk_pages, BIG_CHUNK_PAGES)
    page_table = jnp.pad(md.page_table, ((0, 0), (0, pad)))
    pages = _Pages(k_pages, v_pages, page_table, chunk_pages, page_size, sliding_window, softcap)

    head = min(t, md.kv_lens.shape[0])  # at most R one-token rows
    m, denom, acc = pages.per_token(q[:head], md, history, lead)  # [head, K, G(, H)]
    to_blocks = lambda x, fill: jnp.pad(  # [head, K, G, ...] -> [K, G, T', ...]
        jnp.moveaxis(x, 0, 2),
        [(0, 0), (0, 0), (0, padded - head)] + [(0, 0)] * (x.ndim - 3),
        constant_values=fill,
    )
    carry = (to_blocks(m, MASKED), to_blocks(denom, 0.0), to_blocks(acc, 0.0))
    q_heads = scaled_query_heads(q, k_pages.shape[2], padded - t)  # [K, G, T', H]
    positions = jnp.pad(md.positions, (0, padded - t))
    carry = pages.per_row(carry, q_heads, positions, md, history, lead, real)

    def block_init(qb, start, q_blk, q_rows, q_pos):
        return tuple(jax.lax.dynamic_slice_in_dim(x, start, q_blk.shape[2], 2) for x in carry)

    run = lambda b: causal_blocks(
        q, k_new, v_new, md, block_init, sliding_window=sliding_window, block=min(b, t),
        softcap=softcap,
    )  # fmt: skip
    return run(block) if block else by_longest_row(md, t, run)


class _Pages:
    """The history passes over one layer's pages."""

    def __init__(
        self, k_pages, v_pages, page_table, chunk_pages, page_size, sliding_window, softcap
    ):
        self.k_pages, self.v_pages, self.page_table = k_pages, v_pages, page_table
        self.chunk_pages, self.window, self.softcap = chunk_pages, sliding_window, softcap
        self.page_size = page_size

    def _valid(self, kv_pos, hist, q_pos):
        """[Q, C]: earlier than the step (kv_pos < hist [Q, 1]) and inside the window."""
        valid = kv_pos < hist
        if self.window is not None:
            valid &= kv_pos > q_pos[:, None] - self.window
        return valid

    def per_token(self, q, md: AttentionMetadata, history, lead):
        """History of tokens [0, lead) (q [head, N, H]): per sub-block of S tokens, a loop
        over page chunks up to the sub-block's longest history, S the smallest of SUB_BLOCKS
        that holds `lead` (else the largest): a sub-block computes all S tokens, so 7 decode
        rows in 16-token sub-blocks cost twice 8-token ones. Returns the softmax carry
        token-major: max, denominator [head, K, G], sum [head, K, G, H]."""
        sizes = sorted({min(s, q.shape[0]) for s in SUB_BLOCKS})
        return switch_by_size(sizes, lead, self._per_token, q, md, history, lead)

    def _per_token(self, sub, q, md: AttentionMetadata, history, lead):
        head, n, h = q.shape
        k = self.k_pages.shape[2]
        g = n // k
        head_pad = -(-head // sub) * sub
        padding = lambda x: jnp.pad(x, [(0, head_pad - head)] + [(0, 0)] * (x.ndim - 1))
        q_all = padding(q.reshape(head, k, g, h).astype(jnp.float32) * h**-0.5)
        rows, pos = padding(md.token_rows[:head]), padding(md.positions[:head])
        index = jnp.arange(head_pad, dtype=jnp.int32)
        mine = index < lead
        hist_all = jnp.where(mine, history[rows], 0)  # [head'] 0: not this pass's
        # tokens of other passes read the null page: the same few cache lines, not their rows'
        page_rows = jnp.where(mine[:, None], self.page_table[rows], 0)  # [head', P']

        def sub_block(sb, out):
            at = sb * sub
            q_sb = jax.lax.dynamic_slice_in_dim(q_all, at, sub)  # [S, K, G, H]
            pages_sb = jax.lax.dynamic_slice_in_dim(page_rows, at, sub)  # [S, P']
            hist = jax.lax.dynamic_slice_in_dim(hist_all, at, sub)[:, None]  # [S, 1]
            q_pos = jax.lax.dynamic_slice_in_dim(pos, at, sub)

            carry = token_pages(
                q_sb,
                self.k_pages,
                self.v_pages,
                pages_sb,
                hist,
                q_pos,
                jnp.max(hist),
                chunk_pages=self.chunk_pages,
                sliding_window=self.window,
                softcap=self.softcap,
            )
            return tuple(
                jax.lax.dynamic_update_slice_in_dim(o, c, at, 0)
                for o, c in zip(out, carry, strict=True)
            )

        num_sub = (jnp.minimum(lead, head) + sub - 1) // sub
        out = jax.lax.fori_loop(0, num_sub, sub_block, online_softmax.init((head_pad, k, g), h))
        return tuple(x[:head] for x in out)

    def per_row(self, carry, q_heads, positions, md: AttentionMetadata, history, lead, real):
        """Fold each later row's history into the carry of its tokens [lead, real): q_heads
        [K, G, T', H] scaled, positions [T'], carry [K, G, T'(, H)]. Per row, its tokens go
        through windows of at most WINDOWS[-1] queries, each the smallest of WINDOWS that
        holds them, and each window reads the row's pages once: 8 rows of 40 new tokens past
        1,100 cached ones read 8 x 1,100 positions, where one pass per 32-token query block
        read them for every block a row touched."""
        t = md.token_rows.shape[0]
        sizes = sorted({min(w, q_heads.shape[2]) for w in WINDOWS})
        first_row = md.token_rows[jnp.minimum(lead, t - 1)]
        end_row = jnp.where(lead < real, md.token_rows[jnp.maximum(real - 1, 0)] + 1, first_row)

        def row_pass(r, carry):
            lo, hi = jnp.maximum(md.cu_q_lens[r], lead), md.cu_q_lens[r + 1]

            def window(j, carry):  # tokens [lo + j * W, ...) of the row, W the largest size
                at = lo + j * sizes[-1]
                stop = jnp.minimum(hi, at + sizes[-1])
                args = (carry, r, history[r], q_heads, positions, at, stop)
                return switch_by_size(sizes, stop - at, self._window, *args)

            count = (hi - lo + sizes[-1] - 1) // sizes[-1]
            return jax.lax.fori_loop(0, count, window, carry)

        return jax.lax.fori_loop(first_row, end_row, row_pass, carry)

    def _window(self, w, carry, row, hist, q_blk, q_pos, lo, hi):
        """Row `row`'s history for the queries [lo, hi) (hi - lo <= w) of q_blk [K, G, Q, H],
        computed on the w queries [at, at + w), at <= lo."""
        k, h = self.k_pages.shape[2], self.k_pages.shape[3]
        at = jnp.minimum(lo, q_blk.shape[2] - w)
        q_w = jax.lax.dynamic_slice_in_dim(q_blk, at, w, 2)  # [K, G, W, H]
        pos_w = jax.lax.dynamic_slice_in_dim(q_pos, at, w)
        index = at + jnp.arange(w, dtype=jnp.int32)
        mine = (index >= lo) & (index < hi)  # [W]

        def chunk(carry, first_page, num_pages):  # positions from first_page on
            ids = jax.lax.dynamic_slice_in_dim(self.page_table[row], first_page, num_pages)
            size = num_pages * self.page_size
            k_c = jnp.moveaxis(read_pages(self.k_pages, ids).reshape(size, k, h), 1, 0)
            v_c = jnp.moveaxis(read_pages(self.v_pages, ids).reshape(size, k, h), 1, 0)
            scores = jnp.einsum("kgqh,kch->kgqc", q_w, k_c.astype(jnp.float32))
            scores = soft_cap(scores, self.softcap)
            kv_pos = first_page * self.page_size + jnp.arange(size, dtype=jnp.int32)[None, :]
            valid = self._valid(kv_pos, hist, pos_w) & mine[:, None]  # [W, C]
            scores = jnp.where(valid[None, None], scores, MASKED)
            return online_softmax.fold(carry, scores, v_c.astype(jnp.float32), "kgqc,kch->kgqh")

        part = tuple(jax.lax.dynamic_slice_in_dim(c, at, w, 2) for c in carry)
        num_big, small_from, num_small = big_chunks(hist, self.page_size, self.chunk_pages)
        big = lambda i, c: chunk(c, i * BIG_CHUNK_PAGES, BIG_CHUNK_PAGES)
        part = jax.lax.fori_loop(0, num_big, big, part)
        small = lambda i, c: chunk(c, small_from + i * self.chunk_pages, self.chunk_pages)
        part = jax.lax.fori_loop(0, num_small, small, part)
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(c, p, at, 2)
            for c, p in zip(carry, part, strict=True)
        )
