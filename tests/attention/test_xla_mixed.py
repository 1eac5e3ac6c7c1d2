"""Mixed-step attention (decode rows, continuing and fresh prompt chunks in one step) equals the
reference for every row order, window, block and chunk size."""

import jax.numpy as jnp
import numpy as np
import pytest

from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata
from tgix.attention.pack import RowInput, pack_step
from tgix.attention.reference import reference_attention
from tgix.attention.xla_mixed import BIG_CHUNK_PAGES, big_chunks, mixed_attention

N, K, H, PAGE = 6, 2, 8, 4


def random_step(rng, shapes, num_tokens, num_rows, pages_per_row=64, *, group=(), shared=0):
    """Rows given as (cached, new) token counts on shuffled pages, those in `group` beginning
    with the same `shared` pages (a shared system prompt); pages hold random K/V for every
    position (history and this step's), k_new/v_new are this step's slice of them."""
    free = iter(rng.permutation(np.arange(1, 400)))
    common = [int(next(free)) for _ in range(shared)]
    rows = []
    for i, (cached, new) in enumerate(shapes):
        pages = [int(next(free)) for _ in range(-(-(cached + new) // PAGE))]
        if i in group:
            pages[:shared] = common
        rows.append(RowInput([0] * new, cached, pages))
    arrays = pack_step(rows, page_size=PAGE, num_tokens=num_tokens, num_rows=num_rows,
                       pages_per_row=pages_per_row)  # fmt: skip
    md = AttentionMetadata(**{f: jnp.asarray(arrays[f]) for f in METADATA_FIELDS})
    k_pages, v_pages = (rng.normal(size=(400, PAGE, K, H)).astype(np.float32) for _ in "kv")
    k_pages[0] = v_pages[0] = 1e3  # the null page: padding writes there, nobody reads it
    slots = arrays["slot_mapping"]
    k_new, v_new = k_pages.reshape(-1, K, H)[slots], v_pages.reshape(-1, K, H)[slots]
    q = rng.normal(size=(num_tokens, N, H)).astype(np.float32)
    real = sum(new for _, new in shapes)
    return [jnp.asarray(x) for x in (q, k_new, v_new, k_pages, v_pages)] + [md, real]


STEPS = {
    # decode rows first, then a continuing chunk and fresh prompts: the scheduler's order
    "scheduler order": [(9, 1), (30, 1), (2, 1), (21, 13), (0, 7), (0, 1), (0, 5)],
    # one-token rows with history after a multi-token row go through the per-row pass
    "any order": [(0, 6), (17, 1), (40, 9), (5, 1), (0, 1), (3, 2)],
    # a few leading one-token rows (a middle-sized sub-block)
    "few decode rows": [(3 + 2 * i, 1) for i in range(6)] + [(20, 9)],
    # more leading one-token rows than one sub-block of 16
    "many decode rows": [(3 + 5 * i, 1) for i in range(19)] + [(50, 8), (0, 4)],
    "continuing only": [(61, 24)],
    # a row longer than the largest query window below the block (the whole block's window)
    "long continuing": [(3, 1), (12, 40)],
}


@pytest.mark.parametrize("steps", list(STEPS))
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("block,chunk_pages", [(None, 8), (256, 8), (8, 2), (5, 1)])
def test_mixed_equals_reference(steps, window, block, chunk_pages):
    shapes = STEPS[steps]
    rng = np.random.default_rng(len(shapes) + (block or 0))
    q, k_new, v_new, k_pages, v_pages, md, real = random_step(rng, shapes, 48, 24)
    want = reference_attention(q, k_pages, v_pages, md, sliding_window=window)
    got = mixed_attention(q, k_new, v_new, k_pages, v_pages, md, sliding_window=window,
                          block=block, chunk_pages=chunk_pages)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got)[:real], np.asarray(want)[:real], atol=2e-5)
    assert np.isfinite(np.asarray(got)).all()  # padding tokens too


def test_every_query_window_size_equals_reference():
    """Rows whose new tokens fill each of WINDOWS (16 ... 256, by 1.5x and 2x) and one longer
    than the largest, in one 512-token step."""
    shapes = [(5, 1), (9, 12), (3, 30), (11, 40), (7, 70), (2, 100), (6, 250)]
    rng = np.random.default_rng(7)
    q, k_new, v_new, k_pages, v_pages, md, real = random_step(rng, shapes, 512, 16)
    want = reference_attention(q, k_pages, v_pages, md)
    got = mixed_attention(q, k_new, v_new, k_pages, v_pages, md, chunk_pages=2)
    np.testing.assert_allclose(np.asarray(got)[:real], np.asarray(want)[:real], atol=2e-5)


@pytest.mark.parametrize("window", [None, 100])
def test_long_histories_read_big_chunks_then_small(window):
    """Histories read in big chunks only, big then small, small only, and a rest that takes
    one more big chunk ending past the page table's width (150 pages, padded to 160)."""
    big = BIG_CHUNK_PAGES * PAGE
    shapes = [(3, 1), (150, 2), (big, 6), (big + 80, 5), (2 * big - 100, 3)]
    assert [tuple(int(x) for x in big_chunks(c, PAGE, 2)) for c, _ in shapes] == [
        (0, 0, 1), (0, 0, 19), (1, BIG_CHUNK_PAGES, 0), (1, BIG_CHUNK_PAGES, 10),
        (2, 2 * BIG_CHUNK_PAGES, 0),
    ]  # fmt: skip
    rng = np.random.default_rng(11)
    q, k_new, v_new, k_pages, v_pages, md, real = random_step(rng, shapes, 32, 8, 150)
    want = reference_attention(q, k_pages, v_pages, md, sliding_window=window)
    got = mixed_attention(q, k_new, v_new, k_pages, v_pages, md, sliding_window=window,
                          chunk_pages=2)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got)[:real], np.asarray(want)[:real], atol=2e-5)


SHARED_STEPS = {  # (cached, new) per row for s shared positions; rows on the shared pages;
    # the rows pack marks as sharing them (the leading one-token rows)
    "chat burst": (
        lambda s: [(s + 2, 1), (s + 9, 1), (s + 5, 1), (0, 3), (s + 3, 7), (s + 11, 9), (20, 5)],
        [0, 1, 2, 4, 5],
        [0, 1, 2],
    ),
    # a decode row whose whole history is the shared prefix, one on pages of its own
    "prefix only": (
        lambda s: [(s, 1), (s + 3, 1), (20, 1), (s, 1), (s + 6, 2)],
        [0, 1, 3, 4],
        [0, 1, 3],
    ),  # fmt: skip
}


@pytest.mark.parametrize("steps", list(SHARED_STEPS))
@pytest.mark.parametrize("shared", [5, 37])
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("block,chunk_pages", [(None, 8), (8, 2), (5, 1)])
def test_rows_sharing_prefix_pages_equal_reference(steps, shared, window, block, chunk_pages):
    """Rows whose tables begin with the same pages (prefix caching's shared system prompt),
    with shared_pages set for the leading decode rows: the mixed step reads every row's
    pages in its own passes (the shared pass is the decode step's, where it measured
    faster; BENCHMARKS.md) and still equals the reference."""
    shapes_of, sharing, readers = SHARED_STEPS[steps]
    shapes = shapes_of(shared * PAGE)
    rng = np.random.default_rng(shared + len(shapes))
    step = random_step(rng, shapes, 64, 12, 96, group=sharing, shared=shared)
    q, k_new, v_new, k_pages, v_pages, md, real = step
    shared_pages = np.asarray(md.shared_pages)  # what pack found
    assert list(np.flatnonzero(shared_pages)) == readers
    assert set(shared_pages[readers]) == {shared}
    want = reference_attention(q, k_pages, v_pages, md, sliding_window=window)
    got = mixed_attention(q, k_new, v_new, k_pages, v_pages, md, sliding_window=window,
                          block=block, chunk_pages=chunk_pages)  # fmt: skip
    np.testing.assert_allclose(np.asarray(got)[:real], np.asarray(want)[:real], atol=2e-5)
    assert np.isfinite(np.asarray(got)).all()
