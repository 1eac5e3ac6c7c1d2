"""The reference and the XLA paths (paged, prefill) against a per-token numpy loop over
contiguous histories."""

import jax.numpy as jnp
import numpy as np
import pytest

from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata, write_kv
from tgix.attention.pack import RowInput, pack_step
from tgix.attention.reference import reference_attention
from tgix.attention.xla import paged_attention, prefill_attention

N, K, H, PAGE = 6, 2, 8, 4
FIELDS = METADATA_FIELDS


def naive(q, keys, values, q_pos, window):
    """q [N, H] at position q_pos attends to keys/values [S, K, H] at positions 0..q_pos."""
    g = N // K
    out = np.zeros((N, H))
    for head in range(N):
        kv_head = head // g
        lo = 0 if window is None else max(0, q_pos - window + 1)
        s = keys[lo : q_pos + 1, kv_head] @ q[head] / np.sqrt(H)
        p = np.exp(s - s.max())
        out[head] = (p / p.sum()) @ values[lo : q_pos + 1, kv_head]
    return out


@pytest.mark.parametrize("attend", [reference_attention, paged_attention])
@pytest.mark.parametrize("window", [None, 3])
def test_matches_naive_for_ragged_rows_with_padding(attend, window):
    rng = np.random.default_rng(0)
    # row a: 5 cached + 2 new over pages [3, 1]; row b: 0 cached + 3 new on page [6]
    history = {"a": rng.normal(size=(2, 7, K, H)), "b": rng.normal(size=(2, 3, K, H))}
    rows = [RowInput([0, 0], 5, [3, 1]), RowInput([0, 0, 0], 0, [6])]
    arrays = pack_step(rows, page_size=PAGE, num_tokens=8, num_rows=4, pages_per_row=3)
    md = AttentionMetadata(**{f: jnp.asarray(arrays[f]) for f in FIELDS})
    k_pages = jnp.zeros((8, PAGE, K, H))
    v_pages = jnp.zeros((8, PAGE, K, H))
    # cached history of row a (positions 0..4) written directly into its pages
    for pos in range(5):
        slot = [3, 1][pos // PAGE] * PAGE + pos % PAGE
        k_pages = write_kv(k_pages, jnp.asarray(history["a"][0][pos][None]), jnp.array([slot]))
        v_pages = write_kv(v_pages, jnp.asarray(history["a"][1][pos][None]), jnp.array([slot]))
    new_k = np.concatenate([history["a"][0][5:], history["b"][0], np.zeros((3, K, H))])
    new_v = np.concatenate([history["a"][1][5:], history["b"][1], np.zeros((3, K, H))])
    k_pages = write_kv(k_pages, jnp.asarray(new_k), md.slot_mapping)
    v_pages = write_kv(v_pages, jnp.asarray(new_v), md.slot_mapping)
    q = rng.normal(size=(8, N, H))
    out = np.asarray(
        attend(jnp.asarray(q, jnp.float32), k_pages, v_pages, md, sliding_window=window)
    )
    for t, (name, pos) in enumerate([("a", 5), ("a", 6), ("b", 0), ("b", 1), ("b", 2)]):
        keys, values = history[name]
        np.testing.assert_allclose(out[t], naive(q[t], keys, values, pos, window), atol=1e-5)
    assert np.isfinite(out).all()  # padding tokens too


@pytest.mark.parametrize("block", [None, 256, 5])  # by row length; one block; blocks of 5
@pytest.mark.parametrize("window", [None, 3])
def test_prefill_attention_sees_only_its_rows_earlier_tokens(window, block):
    """Three fresh rows (lengths 4, 1, 6) packed with padding: same result as the naive loop,
    and the padding tokens (row 0, position 0) never leak into row 0."""
    rng = np.random.default_rng(1)
    lengths = [4, 1, 6]
    rows = [RowInput([0] * n, 0, list(range(1 + 2 * i, 3 + 2 * i))) for i, n in enumerate(lengths)]
    arrays = pack_step(rows, page_size=PAGE, num_tokens=16, num_rows=4, pages_per_row=2)
    md = AttentionMetadata(**{f: jnp.asarray(arrays[f]) for f in FIELDS})
    k_new, v_new = rng.normal(size=(2, 16, K, H))
    k_new[11:] = v_new[11:] = 1e3  # padding: huge values would show if attended
    q = rng.normal(size=(16, N, H))
    out = np.asarray(
        prefill_attention(
            jnp.asarray(q, jnp.float32),
            jnp.asarray(k_new, jnp.float32),
            jnp.asarray(v_new, jnp.float32),
            md,
            sliding_window=window,
            block=block,
        )
    )
    start = 0
    for n in lengths:
        for pos in range(n):
            t = start + pos
            keys, values = k_new[start : start + n], v_new[start : start + n]
            np.testing.assert_allclose(out[t], naive(q[t], keys, values, pos, window), atol=1e-5)
        start += n


@pytest.mark.parametrize("window", [None, 37])
def test_paged_equals_reference_over_many_chunks(window):
    """Rows of 1, 70 and 300 cached tokens on shuffled pages: several online-softmax chunks
    (chunk_pages=2 -> 8 tokens a chunk), a page table wider than any row, padding rows."""
    rng = np.random.default_rng(2)
    lengths, page = [1, 70, 300], 4
    perm = iter(rng.permutation(np.arange(1, 200)))
    rows = [RowInput([0], n - 1, [int(next(perm)) for _ in range(-(-n // page))]) for n in lengths]
    arrays = pack_step(rows, page_size=page, num_tokens=4, num_rows=4, pages_per_row=80)
    md = AttentionMetadata(**{f: jnp.asarray(arrays[f]) for f in FIELDS})
    k_pages, v_pages = (jnp.asarray(rng.normal(size=(200, page, K, H)), jnp.float32) for _ in "kv")
    q = jnp.asarray(rng.normal(size=(4, N, H)), jnp.float32)
    want = reference_attention(q, k_pages, v_pages, md, sliding_window=window)
    got = paged_attention(q, k_pages, v_pages, md, sliding_window=window, chunk_pages=2)
    np.testing.assert_allclose(np.asarray(got)[:3], np.asarray(want)[:3], atol=2e-5)
    assert np.isfinite(np.asarray(got)).all()


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("chunk_pages", [1, 8])
def test_paged_rows_sharing_prefix_pages_equal_reference(window, chunk_pages):
    """Decode rows whose tables begin with the same 20 pages (a shared system prompt): the
    shared pass reads them once, each row's loop starts after them; one row's history ends
    at the prefix, one row has pages of its own."""
    rng = np.random.default_rng(3)
    page, shared = 4, 20
    perm = iter(rng.permutation(np.arange(1 + shared, 300)))
    common = list(range(1, 1 + shared))
    lengths = [shared * page + 1, shared * page + 45, 70, shared * page + 9]
    rows = []
    for i, n in enumerate(lengths):
        own = [int(next(perm)) for _ in range(-(-n // page))]
        rows.append(RowInput([0], n - 1, own if i == 2 else common + own[shared:]))
    arrays = pack_step(rows, page_size=page, num_tokens=6, num_rows=6, pages_per_row=40)
    np.testing.assert_array_equal(arrays["shared_pages"], [shared, shared, 0, shared, 0, 0])
    md = AttentionMetadata(**{f: jnp.asarray(arrays[f]) for f in FIELDS})
    k_pages, v_pages = (jnp.asarray(rng.normal(size=(300, page, K, H)), jnp.float32) for _ in "kv")
    q = jnp.asarray(rng.normal(size=(6, N, H)), jnp.float32)
    want = reference_attention(q, k_pages, v_pages, md, sliding_window=window)
    got = paged_attention(q, k_pages, v_pages, md, sliding_window=window, chunk_pages=chunk_pages)
    np.testing.assert_allclose(np.asarray(got)[:4], np.asarray(want)[:4], atol=2e-5)
    assert np.isfinite(np.asarray(got)).all()
