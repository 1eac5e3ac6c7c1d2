"""Weight quantization at load time: `--quantize eetq | bitsandbytes | fp8`.

One representation for every quantized linear layer: `codes [N, K]` (out, in: each output
channel's inputs contiguous) and `scale [N]` float32, with W[k, n] ~= codes[n, k] * scale[n].
A per-output-channel scale makes the product exact to rescale after the sum,
y[t, n] = scale[n] * sum_k x[t, k] * codes[n, k], and lets every shard of a tensor-parallel
layer quantize its own rows or columns identically (a row's scale never spans shards).

  eetq, bitsandbytes   int8 codes, scale = max|W[:, n]| / 127 (round to nearest). TGI's eetq is
                       this; bitsandbytes' LLM.int8 also keeps outlier columns in fp16, which
                       is not reproduced (the per-channel int8 error is the whole difference).
  fp8                  float8_e4m3fn codes, scale = max|W[:, n]| / 448, clipped before the cast
                       (a cast to e4m3fn does not saturate: 500.0 becomes NaN).

`qmatmul` is the seam Dense calls. How it runs is chosen per platform and per static row count
T (a bucket's), by measurement (`python -m benchmarks.quant`, BENCHMARKS.md): XLA:CPU does not
fuse "convert then dot" (it writes a float32 copy of the weight each call), but an elementwise
multiply with a last-axis reduction over [N, K] codes reads them directly.

Embeddings, norms and the LM head stay in the model dtype (as in TGI); on tgix's int8 CPU
kernel the head is read from a bfloat16 copy (models/__init__.load_model, decoder.logits). An
int8 copy of the default model's tied LM head was tried before that kernel: no speed
difference measurable through XLA's int8 dot, perplexity +0.48% instead of +0.02%.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from tgix.models import cpu_int8

# --quantize value -> codes dtype; TGI's other values are refused by name in METHOD_ERRORS
CODES_DTYPE = {"eetq": np.int8, "bitsandbytes": np.int8, "fp8": ml_dtypes.float8_e4m3fn}
_CODE_MAX = {np.dtype(np.int8): 127.0, np.dtype(ml_dtypes.float8_e4m3fn): 448.0}

# Rows at or below which XLA:CPU runs the multiply-and-reduce form (measured; above it the
# convert-then-dot form, whose float32 weight copy is paid once for many rows, is faster).
CPU_REDUCE_MAX_ROWS = 8


def quantize_rows(w: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """A float weight [N, K] (out, in: HF's linear layout) -> (codes [N, K], scale [N]
    float32), per output channel. An all-zero channel gets scale 1 (codes 0)."""
    codes_dtype = np.dtype(CODES_DTYPE[method])
    code_max = _CODE_MAX[codes_dtype]
    w = np.asarray(w, dtype=np.float32)
    absmax = np.max(np.abs(w), axis=1)
    scale = np.where(absmax > 0, absmax / code_max, 1.0).astype(np.float32)
    scaled = np.clip(w / scale[:, None], -code_max, code_max)
    if codes_dtype == np.int8:
        return np.rint(scaled).astype(np.int8), scale
    return scaled.astype(codes_dtype), scale


def dequantize(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(codes [N, K], scale [N]) -> the float32 weight [N, K] they stand for."""
    return np.asarray(codes, np.float32) * np.asarray(scale, np.float32)[:, None]


def qmatmul(
    x: jax.Array,
    codes: jax.Array,
    scale: jax.Array,
    *,
    int8_activations: bool = False,
    native: bool = False,
) -> jax.Array:
    """x [T, K] @ the kernel (codes [N, K], scale [N]) -> [T, N] in x's dtype.

    native (XLA:CPU, cpu_int8.available()): `codes` are packed (cpu_int8.pack, uint8
    [N/16, K/4, 64]) and tgix's own kernel (cpu_int8_packed.cc) runs the product at every
    row count: x as two int8 digits (split_activations' rounding), exact integer sums with
    AVX512-VNNI, each code read once per tile of rows (BENCHMARKS.md, "Packed codes").

    int8_activations (int8 codes only): x is written as two int8 digits per element
    (split_activations) and both digit rows go through one int8 x int8 -> int32 dot, which
    reads the codes once; integer sums are exact, so a row's result does not depend on the
    other rows of the step. On XLA:CPU this is the fast form of a decode step (BENCHMARKS.md).
    Otherwise weight-only: the codes are converted and dotted with x as is (on XLA:CPU, up to
    CPU_REDUCE_MAX_ROWS rows, as a multiply and a last-axis reduce, which reads the codes
    without writing a float copy of them)."""
    if native:
        return cpu_int8.packed_matmul(x, codes, scale)
    if int8_activations:
        return _int8_dot(x, codes, scale)
    t = x.shape[0]
    if jax.default_backend() == "cpu" and t <= CPU_REDUCE_MAX_ROWS:
        w = codes.astype(jnp.float32)
        x32 = x.astype(jnp.float32)
        if t == 1:  # a rank-1 activation: the fast plan (rank-2 [1, K] is far slower)
            y = jnp.sum(w * x32[0][None, :], axis=-1)[None]  # [1, N]
        else:  # weights first: [1, N, K] * [T, 1, K], reduced over K
            y = jnp.sum(w[None] * x32[:, None, :], axis=-1)  # [T, N]
    else:
        y = jnp.einsum("tk,nk->tn", x, codes.astype(x.dtype), preferred_element_type=jnp.float32)
    return (y * scale[None, :]).astype(x.dtype)


DIGIT = 254.0  # the low digit's weight: |x / s - high| <= 1/2, so low = round(254 * that) fits int8


def split_activations(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [T, K] -> (high, low int8 [T, K], s [T, 1] float32) with
    x ~= s * (high + low / DIGIT): s = max|row| / 127, high = round(x / s), low = round(DIGIT
    * (x / s - high)) (round half to even). The error is at most s / (2 * DIGIT) per element,
    about 1/64,000 of the row's largest value: a single int8 digit (1/254) flips greedy
    tokens of the default model within 5-10 tokens, two keep float32's (BENCHMARKS.md). An
    all-zero row (padding) gets s = 1."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1, keepdims=True)
    s = jnp.where(absmax > 0, absmax / 127.0, 1.0)
    v = x32 / s
    high = jnp.round(v)
    low = jnp.round((v - high) * DIGIT)
    return high.astype(jnp.int8), low.astype(jnp.int8), s


def _int8_dot(x: jax.Array, codes: jax.Array, scale: jax.Array) -> jax.Array:
    """[T, K] x int8 [N, K] -> [T, N]: one integer dot of both digit rows [2T, K] (exact
    int32 sums; K * 127 * 127 < 2^31 for K < 133,000), then the scales."""
    t = x.shape[0]
    high, low, s = split_activations(x)
    acc = jax.lax.dot_general(
        jnp.concatenate([high, low]), codes, (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.int32,
    ).astype(jnp.float32)  # fmt: skip
    return ((acc[:t] + acc[t:] * (1.0 / DIGIT)) * s * scale[None, :]).astype(x.dtype)


def default_int8_activations(method: str) -> bool:
    """Whether a method's layers quantize their activations by default: int8 codes on CPU
    (the integer dot is XLA:CPU's fast form), never elsewhere (weight-only, as TGI's eetq)."""
    return np.dtype(CODES_DTYPE[method]) == np.int8 and jax.default_backend() == "cpu"


def default_native(method: str) -> bool:
    """Whether a method's layers run tgix's int8 CPU kernel by default: int8 codes on XLA:CPU
    where the kernel builds and the CPU has AVX512-VNNI (cpu_int8.fast; elsewhere its
    portable loop is slower than XLA's forms; TGIX_CPU_KERNELS=0 turns it off)."""
    return np.dtype(CODES_DTYPE[method]) == np.int8 and cpu_int8.fast()


def quantize_abstract(
    model: nnx.Module,
    method: str,
    *,
    int8_activations: bool | None = None,
    native: bool | None = None,
) -> nnx.Module:
    """Turn every Dense of an abstract model (nnx.eval_shape) into a quantized one: its
    `kernel [K, N]` becomes `codes [N, K]` + `scale [N]` with the kernel's logical axes
    (reversed for codes), so weights.load_weights fills them and sharding places them as it
    would the kernel. `int8_activations` (None: default_int8_activations) and `native` (None:
    default_native; False on a mesh of several devices, which GSPMD cannot split an FFI call
    over) pick qmatmul's form for every layer; native codes are packed
    (`cpu_int8.packed_shape`, uint8, replicated)."""
    from tgix.models.layers import Dense

    codes_dtype = jnp.dtype(CODES_DTYPE[method])
    if int8_activations is None:
        int8_activations = default_int8_activations(method)
    if int8_activations and codes_dtype != jnp.int8:
        raise ValueError(f"--quantize {method}: int8 activations need int8 codes")
    if native is None:
        native = default_native(method)
    if native and codes_dtype != jnp.int8:
        raise ValueError(f"--quantize {method}: the native CPU kernel needs int8 codes")
    for _, module in nnx.iter_modules(model):
        if not isinstance(module, Dense) or module.kernel is None:
            continue
        k_in, n_out = module.kernel.shape
        axes = module.kernel.axes
        if native:  # weights.load_weights packs them (cpu_int8.pack)
            packed = jax.ShapeDtypeStruct(cpu_int8.packed_shape(n_out, k_in), jnp.uint8)
            codes = nnx.Param(packed, axes=("packed",) * 3)
        else:
            codes = nnx.Param(jax.ShapeDtypeStruct((n_out, k_in), codes_dtype), axes=axes[::-1])
        module.codes = nnx.data(codes)
        module.scale = nnx.data(
            nnx.Param(jax.ShapeDtypeStruct((n_out,), jnp.float32), axes=axes[-1:])
        )
        module.kernel = nnx.data(None)
        module.int8_activations = int8_activations
        module.native_int8 = native
    return model
