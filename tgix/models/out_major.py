"""Float linear layers stored out-major, `weight [N, K]` (N outputs, K inputs, as quant.py's
codes), and the product that reads them: the layout XLA:CPU runs fastest for the small row
counts of decode and verify steps.

On XLA:CPU every dot of 2+ rows goes to YNNPACK, which runs `[N, K] x [K, T]` (the large
dimension first, the small one last) faster than the same product as `[T, K] x [K, N]` for up
to 64 rows (the default model's 30 MLP blocks: 0.47-0.68x the time from 2 to 32 rows), and
with weights [N, K] a one-row product reads each output's inputs contiguously. Whole model
steps of the default model, [in, out] against [out, in] (`python -m benchmarks.dot_layout
--steps dense`): decode 8 rows 0.63-0.71x, verify 1 row x 8 tokens 0.66-0.73x, decode 32
rows 0.88-0.90x, decode 1 row 0.91-0.97x, prefill of 512 tokens 1.02-1.03x (BENCHMARKS.md,
"Dot layouts on XLA:CPU"). So on CPU, with float weights, every 2-D Dense holds `weight
[N, K]` instead of `kernel [K, N]` (`out_major_abstract`, filled by weights.load_weights as it
fills quantized `codes [N, K]`), and the tied LM head, an embedding `[V, D]`, is already laid
out so. Other backends keep `kernel [K, N]`. `TGIX_DENSE_LAYOUT=in_out` turns it off (to
compare).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

# Rows T for which `out_major_matmul` computes [N, K] x [K, T] and transposes the result.
# Past 64 rows that order is slower (30 MLP blocks, 512 rows: 1.3x) and `x @ W.T` is not
# (1.02x, 0.83x at 2,048); at 64 rows `x @ W.T` made a 64-row decode step 1.15x slower.
TRANSPOSED_ROWS = (1, 64)


def out_major_matmul(x: jax.Array, weight: jax.Array, rows=TRANSPOSED_ROWS, **dot) -> jax.Array:
    """x [T, K] @ weight [N, K].T -> [T, N]. For `rows` (lo, hi) on CPU as `[N, K] x [K, T]`
    then transposed behind an optimization barrier (without it XLA's simplifier folds the
    transpose back into the dot); otherwise `[T, K] x [N, K]^T`. `dot`: einsum's keywords
    (preferred_element_type)."""
    lo, hi = rows
    if lo <= x.shape[0] <= hi and jax.default_backend() == "cpu":
        y_nt = jnp.einsum("nk,tk->nt", weight, x, **dot)
        return jax.lax.optimization_barrier(y_nt).T
    return jnp.einsum("tk,nk->tn", x, weight, **dot)


def default_out_major() -> bool:
    """Whether float Dense layers are stored [N, K]: on CPU, unless TGIX_DENSE_LAYOUT=in_out."""
    layout = os.environ.get("TGIX_DENSE_LAYOUT", "out_in")
    if layout not in ("out_in", "in_out"):
        raise ValueError(f"TGIX_DENSE_LAYOUT={layout!r}: out_in or in_out")
    return layout == "out_in" and jax.default_backend() == "cpu"


def out_major_abstract(model: nnx.Module) -> nnx.Module:
    """Turn every float Dense of an abstract model (nnx.eval_shape) into an out-major one: its
    `kernel [K, N]` becomes `weight [N, K]` with the kernel's logical axes reversed, so
    weights.load_weights fills it (transposing the kernel) and sharding places it as it
    would the kernel. Quantized layers (kernel None) are left as they are."""
    from tgix.models.layers import Dense

    for _, module in nnx.iter_modules(model):
        if not isinstance(module, Dense) or module.kernel is None:
            continue
        k_in, n_out = module.kernel.shape
        weight = jax.ShapeDtypeStruct((n_out, k_in), module.kernel.dtype)
        module.weight = nnx.data(nnx.Param(weight, axes=module.kernel.axes[::-1]))
        module.kernel = nnx.data(None)
    return model
