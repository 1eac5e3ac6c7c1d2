"""Attention over long histories, per layer: what a chat turn's decode and cached-prompt
steps spend in the XLA attention paths once every row has ~1,000 positions in its pages.

    python -m benchmarks.attention_history [--history 1200] [--chunk-pages 8 32 80]
        [--shared 992]

The default model's attention shape (N=9 query heads, K=3 KV heads, H=64, 16-token pages,
a 4,097-page pool), jitted alone, median of 20 calls after two warm-up calls:
  decode  paged_attention for R one-token rows at --history positions
  mixed   mixed_attention for one decode row plus R rows of n new tokens each past --history
          positions (prompts that start past a cached prefix), in a 64-row step
  chat    the chat load's chunked steps (benchmarks.chat_load, 128-token budget): D decode
          rows and R turns of n new tokens past --history positions in a T = 128 step
for each --chunk-pages value (pages read per loop iteration). With --shared S every row's
table begins with the same S // 16 pages (prefix caching's shared system prompt: 992 of the
chat load's 1,000 tokens fill whole pages), read once for the step (tgix.attention.
shared_prefix). Prints ms per layer.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata
from tgix.attention.pack import RowInput, pack_step
from tgix.attention.xla import paged_attention
from tgix.attention.xla_mixed import mixed_attention

PAGE, KV_HEADS, HEAD_DIM, HEADS, POOL = 16, 3, 64, 9, 4097
# (label, decode rows, prompt rows, new ids a prompt row, T of the step)
STEPS = [("mixed", 1, rows, new, 512 if rows * new > 63 else 64)
         for rows, new in ((1, 38), (7, 8), (7, 38))]  # fmt: skip
STEPS += [("chat", decode, rows, new, 128)
          for decode, rows, new in ((5, 3, 40), (7, 1, 34), (3, 1, 80), (0, 4, 30))]  # fmt: skip


def _metadata(rows, num_tokens: int, num_rows: int) -> AttentionMetadata:
    arrays = pack_step(
        rows, page_size=PAGE, num_tokens=num_tokens, num_rows=num_rows, pages_per_row=256
    )
    return AttentionMetadata(**{k: jnp.asarray(arrays[k]) for k in METADATA_FIELDS})


def _ms(fn, *args) -> float:
    fn(*args).block_until_ready()
    fn(*args).block_until_ready()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _pages_of(row: int, history: int, shared: int = 0) -> list[int]:
    """Row `row`'s pages: its history and up to 128 new tokens (STEPS' rows have 80), the
    first shared // PAGE of them the same for every row."""
    per_row = -(-(history + 128) // PAGE)
    common = shared // PAGE
    own = range(1 + common + row * per_row, 1 + common + (row + 1) * per_row)
    return (list(range(1, 1 + common)) + list(own))[:per_row]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1200)
    parser.add_argument("--chunk-pages", type=int, nargs="+", default=[8, 32, 80])
    parser.add_argument("--shared", type=int, default=0, help="positions every row shares")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    k_pages = jnp.asarray(rng.standard_normal((POOL, PAGE, KV_HEADS, HEAD_DIM), np.float32))
    v_pages = 0.5 * k_pages
    hist = args.history
    for chunk in args.chunk_pages:
        for rows in (1, 8):
            decode_rows = [
                RowInput([1], hist - 1, _pages_of(i, hist, args.shared)) for i in range(rows)
            ]
            md = _metadata(decode_rows, rows, rows)
            q = jnp.ones((rows, HEADS, HEAD_DIM), jnp.float32)
            fn = jax.jit(functools.partial(paged_attention, chunk_pages=chunk))
            ms = _ms(fn, q, k_pages, v_pages, md)
            print(f"decode  {rows} rows at {hist}, chunk {chunk}: {ms:.2f} ms")
        mixed = jax.jit(functools.partial(mixed_attention, chunk_pages=chunk))
        for label, decode, rows, new, num_tokens in STEPS:
            batch = [RowInput([1], hist, _pages_of(i, hist, args.shared)) for i in range(decode)]
            batch += [
                RowInput([1] * new, hist, _pages_of(decode + i, hist, args.shared))
                for i in range(rows)
            ]
            md = _metadata(batch, num_tokens, 64)
            q = jnp.ones((num_tokens, HEADS, HEAD_DIM), jnp.float32)
            kv_new = jnp.ones((num_tokens, KV_HEADS, HEAD_DIM), jnp.float32)
            ms = _ms(mixed, q, kv_new, kv_new, k_pages, v_pages, md)
            step = f"{decode} decode + {rows} x {new} past {hist}"
            print(f"{label:7s} {step}, chunk {chunk}: {ms:.2f} ms")


if __name__ == "__main__":
    main()
