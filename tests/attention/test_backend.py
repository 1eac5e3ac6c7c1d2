"""The backend protocol: every registered backend satisfies it and gives the reference's result
(and the same written pages) for a mixed step and a fresh one; the host packer imports no jax."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from tgix.attention.backend import BACKENDS, AttentionBackend, backend
from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata, LayerKV
from tgix.attention.pack import RowInput

N, K, H, PAGE, NUM_PAGES = 6, 2, 8, 4, 64

# (cached, new) tokens per row: two decode rows, a fresh prompt chunk, a row past a cached
# prefix (start_pos > 0, several new tokens)
MIXED = [(9, 1), (3, 1), (0, 7), (12, 5)]
FRESH = [(0, 5), (0, 1), (0, 9)]


def test_registered_backends_satisfy_the_protocol():
    from tgix import build_model, testing
    from tgix.models.config import ModelConfig

    cfg = ModelConfig.from_hf(testing.tiny_hf_config("llama"))
    for name in BACKENDS:
        attention = backend(name)
        assert isinstance(attention, AttentionBackend) and attention.name == name
        assert attention.kv_shape(NUM_PAGES, PAGE, K, H) == (NUM_PAGES, PAGE, K, H)
        model = build_model(cfg, attention=name, abstract=True)
        assert model.attention == attention
        assert all(layer.self_attn.backend is model.attention for layer in model.layers)


def test_unknown_backend_is_refused():
    from tgix import build_model, testing
    from tgix.models.config import ModelConfig

    cfg = ModelConfig.from_hf(testing.tiny_hf_config("llama"))
    known = "known: \\['paged', 'reference'\\]"
    with pytest.raises(ValueError, match=f"attention backend 'pallas'; {known}"):
        build_model(cfg, attention="pallas", abstract=True)


def run_step(attention, shapes, *, fresh, pages_per_row, window, seed=0):
    """One layer's call on rows (cached, new) over shuffled pages that hold random history;
    returns (out [T, N, H] of the real tokens, the pages after the call, as numpy)."""
    rng = np.random.default_rng(seed)
    free = iter(rng.permutation(np.arange(1, NUM_PAGES)))
    rows = []
    for cached, new in shapes:
        pages = [int(next(free)) for _ in range(-(-(cached + new) // PAGE))]
        rows.append(RowInput([0] * new, cached, pages))
    real = sum(new for _, new in shapes)
    packed = attention.pack(rows, page_size=PAGE, num_tokens=real + 3, num_rows=len(rows) + 1,
                            pages_per_row=pages_per_row)  # fmt: skip
    md = AttentionMetadata(**{f: jnp.asarray(packed[f]) for f in METADATA_FIELDS})
    shape = attention.kv_shape(NUM_PAGES, PAGE, K, H)
    kv = LayerKV(*(jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in "kv"))
    t = len(packed["token_ids"])
    q = jnp.asarray(rng.normal(size=(t, N, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(t, K, H)), jnp.float32) for _ in "kv")
    out, kv = attention(q, k, v, kv, md, fresh=fresh, sliding_window=window)
    assert out.shape == (t, N, H) and np.isfinite(np.asarray(out)).all()  # padding tokens too
    return np.asarray(out)[:real], [np.asarray(x)[1:] for x in kv]  # page 0: padding writes


@pytest.mark.parametrize("window", [None, 3])
def test_backends_agree_on_a_mixed_step(window):
    results = [
        run_step(backend(name), MIXED, fresh=False, pages_per_row=8, window=window)
        for name in BACKENDS
    ]
    (want, want_kv), *others = results
    for got, got_kv in others:
        np.testing.assert_allclose(got, want, atol=2e-5)
        for a, b in zip(got_kv, want_kv, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("pages_per_row", [0, 4])  # fresh buckets pack no page table
def test_backends_agree_on_a_fresh_step(pages_per_row):
    want, _ = run_step(backend("reference"), FRESH, fresh=False, pages_per_row=4, window=None)
    for name in BACKENDS:
        got, _ = run_step(
            backend(name), FRESH, fresh=True, pages_per_row=pages_per_row, window=None
        )
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=name)


def test_host_packer_imports_no_jax():
    code = "import sys, tgix.attention.pack; sys.exit(int('jax' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
