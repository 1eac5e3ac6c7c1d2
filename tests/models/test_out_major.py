"""Float Dense layers stored [out, in] on CPU (tgix/models/out_major.py): the same numbers as
the [in, out] kernels they replace, in both of the product's forms, and placed as a transpose
of the checkpoint's kernel."""

import jax
import numpy as np
import pytest

from tests.models.test_weights import first_logits
from tgix.models import load_model
from tgix.models.layers import Dense
from tgix.models.out_major import TRANSPOSED_ROWS, default_out_major, out_major_matmul


@pytest.mark.parametrize("rows", [1, 2, 8, 64, 65, 200])
def test_product_equals_the_plain_dot(rows):
    """Transposed (TRANSPOSED_ROWS) or not, x @ weight.T; the jitted product too (where the
    optimization barrier must keep the transpose)."""
    k_in, n_out = 96, 160
    x = jax.random.normal(jax.random.key(rows), (rows, k_in))
    weight = jax.random.normal(jax.random.key(1), (n_out, k_in))
    expected = np.asarray(x) @ np.asarray(weight).T
    for product in (out_major_matmul, jax.jit(out_major_matmul)):
        got = np.asarray(product(x, weight))
        assert got.shape == (rows, n_out)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    assert (TRANSPOSED_ROWS[0] <= rows <= TRANSPOSED_ROWS[1]) == (rows <= 64)


def test_layout_switch(monkeypatch):
    monkeypatch.delenv("TGIX_DENSE_LAYOUT", raising=False)
    assert default_out_major()  # these tests run on CPU
    monkeypatch.setenv("TGIX_DENSE_LAYOUT", "in_out")
    assert not default_out_major()
    monkeypatch.setenv("TGIX_DENSE_LAYOUT", "row-major")
    with pytest.raises(ValueError, match="TGIX_DENSE_LAYOUT='row-major'"):
        default_out_major()


def _dense_layers(model) -> dict:
    from flax import nnx

    return {path: m for path, m in nnx.iter_modules(model) if isinstance(m, Dense)}


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q/k/v with biases
def test_weights_are_the_transposed_kernels(tiny_checkpoints, monkeypatch, family):
    folder = str(tiny_checkpoints(family))
    monkeypatch.setenv("TGIX_DENSE_LAYOUT", "in_out")
    in_out = load_model(folder)
    monkeypatch.delenv("TGIX_DENSE_LAYOUT")
    out_in = load_model(folder)
    kernels, weights = _dense_layers(in_out.model), _dense_layers(out_in.model)
    assert kernels.keys() == weights.keys() and len(kernels) == 7 * in_out.config.num_layers
    for path, dense in weights.items():
        assert dense.kernel is None and kernels[path].weight is None
        kernel = np.asarray(kernels[path].kernel[...])
        np.testing.assert_array_equal(np.asarray(dense.weight[...]), kernel.T)
    short, long = [5, 17, 42, 99, 3, 250], list(range(3, 83))  # 6 rows: transposed; 80: not
    pages = {"num_pages": 32, "pages_per_row": 24}
    for prompt in (short, long):
        np.testing.assert_allclose(
            first_logits(out_in, prompt, **pages),
            first_logits(in_out, prompt, **pages),
            rtol=1e-5,
            atol=1e-5,
        )


def test_quantized_layers_stay_quantized(tiny_checkpoints):
    loaded = load_model(str(tiny_checkpoints("llama")), quantize="eetq")
    for dense in _dense_layers(loaded.model).values():
        assert dense.weight is None and dense.kernel is None and dense.codes is not None
