"""Group-quantized linear weights: integer codes with a scale (and zero, offset) per group of
inputs, the one form every pre-quantized format loads into (tgix/models/prequant.py).

Canonical layout [N, K] (out, in: HF's linear layout and quant.py's), groups of G consecutive
inputs along K, j // G the group of column j:

    W[n, perm[j]] = (q[n, j] - zero[n, j // G]) * scale[n, j // G] + offset[n, j // G]

  q       unsigned integer codes, 0 .. 2^bits - 1 (a signed format's offset goes into zero)
  scale   float32 [N, K / G]
  zero    float32 [N, K / G] or None (0): AWQ/GPTQ zero points, compressed-tensors' 2^(b-1)
  offset  float32 [N, K / G] or None (0): an additive minimum (GGUF Q4_1)
  perm    int32 [K] or None (identity): GPTQ act-order, the inputs sorted by group so that
          every group is G consecutive columns
Each format's definition is this with the absent terms dropped, so `dequantize` reproduces it
bit for bit in float32 (q - zero is exact for small integers, "+ 0" is exact).

How the model runs such a layer (`GroupedForm`, chosen per platform by measurement,
BENCHMARKS.md "Pre-quantized checkpoints"):
  float  dequantized on the host at load, into the model dtype: exact, and as fast as a float
         checkpoint. The CPU default: XLA:CPU does not fuse unpack-and-scale into the dot (it
         writes a float copy of the weight every call), which measured 1.2-2.4x slower than
         the float dot even for cache-resident layers, and grouped integer dots 3-15x slower.
  kept   the codes stay on the device (4-bit packed two per byte: 0.5 byte per weight plus
         the group terms) and are dequantized inside the step, the form GPU/TPU compilers fuse
         into the dot. The GPU/TPU default.
  int8   dequantized, then re-quantized per output channel to quant.py's int8 codes (each
         weight moves by up to half an int8 step): XLA:CPU's fast integer form; opt-in.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

GROUPED_FORMS = ("float", "kept", "int8")
CODEBOOK_METHODS = {"bitsandbytes-nf4": "nf4", "bitsandbytes-fp4": "fp4"}  # --quantize -> book


def _nf4() -> np.ndarray:
    """QLoRA's NormalFloat4: 8 positive and 7 negative normal quantiles and 0, scaled to
    [-1, 1] (bitsandbytes' create_normal_map with its offset 0.9677083), ascending."""
    from statistics import NormalDist

    inv = NormalDist().inv_cdf
    pos = [inv(p) for p in np.linspace(0.9677083, 0.5, 9)[:-1]]
    neg = [-inv(p) for p in np.linspace(0.9677083, 0.5, 8)[:-1]]
    values = np.array(sorted(pos + [0.0] + neg))
    return (values / np.abs(values).max()).astype(np.float32)


def _fp4() -> np.ndarray:
    """bitsandbytes' FP4 (sign, 2 exponent bits, 1 mantissa bit, bias 3, code
    8 * sign + 4 * e1 + 2 * e2 + m) scaled so its largest value, 12, is 1."""
    values = []
    for code in range(16):
        sign, exp, mantissa = -1.0 if code & 8 else 1.0, (code >> 1) & 3, code & 1
        value = 0.0625 * mantissa if exp == 0 else 2.0 ** (4 - exp) * (1.5 if mantissa else 1.0)
        values.append(sign * value)
    return (np.array(values) / 12.0).astype(np.float32)


def _fp8_e4m3fn() -> np.ndarray:
    """Every float8_e4m3fn value by its byte (a pre-quantized fp8 checkpoint's codes, kept as
    bytes; the two NaN bytes never occur in a clipped weight)."""
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


# code -> value, times the block's scale (absmax for nf4/fp4, the fp8 checkpoint's scale)
CODEBOOKS = {"nf4": _nf4(), "fp4": _fp4(), "fp8_e4m3fn": _fp8_e4m3fn()}


def default_form() -> str:
    """The form a pre-quantized checkpoint runs in when none is asked for (module docstring)."""
    return "float" if jax.default_backend() == "cpu" else "kept"


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """What a grouped layer holds; static per layer, so the abstract model can be built
    before any tensor is read."""

    bits: int
    group: int
    zero: bool
    offset: bool
    perm: bool
    codebook: str | None = None  # CODEBOOKS key: W = book[q] * scale (zero, offset absent)

    @property
    def packed(self) -> bool:
        """4-bit codes are stored two per byte (element 2i in the low nibble)."""
        return self.bits == 4


@dataclasses.dataclass
class GroupedWeight:
    """One linear layer's quantized weight on the host (see the module docstring)."""

    codes: np.ndarray  # uint8 [N, K], 0 .. 2^bits - 1
    scale: np.ndarray  # float32 [N, K / G]
    bits: int
    zero: np.ndarray | None = None  # float32 [N, K / G]
    offset: np.ndarray | None = None  # float32 [N, K / G]
    perm: np.ndarray | None = None  # int32 [K]
    codebook: str | None = None  # CODEBOOKS key: W = book[q] * scale

    def __post_init__(self):
        n, k = self.codes.shape
        groups = self.scale.shape[1]
        if self.scale.shape[0] != n or k % groups:
            raise ValueError(f"scale {self.scale.shape} does not group codes {self.codes.shape}")
        for name in ("zero", "offset"):
            term = getattr(self, name)
            if term is not None and term.shape != self.scale.shape:
                raise ValueError(f"{name} {term.shape} differs from scale {self.scale.shape}")
        if self.perm is not None and sorted(self.perm.tolist()) != list(range(k)):
            raise ValueError("perm is not a permutation of the inputs")

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    @property
    def layout(self) -> GroupLayout:
        return GroupLayout(
            bits=self.bits,
            group=self.codes.shape[1] // self.scale.shape[1],
            zero=self.zero is not None,
            offset=self.offset is not None,
            perm=self.perm is not None,
            codebook=self.codebook,
        )

    def dequantize(self) -> np.ndarray:
        """The float32 weight [N, K] in the checkpoint's input order."""
        n, k = self.codes.shape
        g = k // self.scale.shape[1]
        if self.codebook is not None:
            q = CODEBOOKS[self.codebook][self.codes].reshape(n, k // g, g)
        else:
            q = self.codes.astype(np.float32).reshape(n, k // g, g)
        if self.zero is not None:
            q = q - self.zero[:, :, None]
        w = q * self.scale[:, :, None]
        if self.offset is not None:
            w = w + self.offset[:, :, None]
        w = w.reshape(n, k)
        if self.perm is None:
            return w
        out = np.empty_like(w)
        out[:, self.perm] = w
        return out

    def take_rows(self, rows: np.ndarray) -> GroupedWeight:
        """The weight of output channels `rows` (a head repeat or permutation at load)."""
        pick = lambda a: None if a is None else a[rows]
        return dataclasses.replace(
            self, codes=self.codes[rows], scale=self.scale[rows],
            zero=pick(self.zero), offset=pick(self.offset),
        )  # fmt: skip

    def device_arrays(self) -> dict[str, np.ndarray]:
        """Dense's parameter name -> host array, as the kept form stores them."""
        codes = pack_nibbles(self.codes) if self.bits == 4 else self.codes.astype(np.uint8)
        out = {"codes": codes, "scale": self.scale.astype(np.float32)}
        for name in ("zero", "offset"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).astype(np.float32)
        if self.perm is not None:
            out["perm"] = self.perm.astype(np.int32)
        return out


def unpack_words(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words -> unsigned codes, 32 / bits per word along `axis`, low bits first."""
    per = 32 // bits
    words = np.ascontiguousarray(words).view(np.uint32)
    shifts = np.arange(per, dtype=np.uint32) * bits
    codes = (np.expand_dims(words, -1) >> shifts) & np.uint32((1 << bits) - 1)  # [..., per]
    codes = np.moveaxis(codes, -1, axis + 1)  # the per-word index right after its word axis
    shape = list(words.shape)
    shape[axis] *= per
    return codes.reshape(shape).astype(np.uint8)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [N, K] (values < 16, K even) -> [N, K / 2], element 2i in the low nibble."""
    codes = codes.astype(np.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: jax.Array) -> jax.Array:
    """[N, K / 2] uint8 -> [N, K] uint8 (the inverse of pack_nibbles)."""
    n, half = packed.shape
    return jnp.stack([packed & 15, packed >> 4], axis=-1).reshape(n, 2 * half)


def grouped_matmul(x: jax.Array, layout: GroupLayout, params: dict[str, jax.Array]) -> jax.Array:
    """x [T, K] @ the grouped weight (params as GroupedWeight.device_arrays) -> [T, N].
    The weight is dequantized in float32 inside the step, then dotted in x's dtype."""
    codes = params["codes"]
    q = unpack_nibbles(codes) if layout.packed else codes
    n, k = q.shape
    g = layout.group
    if layout.codebook is not None:
        w = jnp.asarray(CODEBOOKS[layout.codebook])[q].reshape(n, k // g, g)
    else:
        w = q.astype(jnp.float32).reshape(n, k // g, g)
    if layout.zero:
        w = w - params["zero"][:, :, None]
    w = w * params["scale"][:, :, None]
    if layout.offset:
        w = w + params["offset"][:, :, None]
    if layout.perm:
        x = jnp.take(x, params["perm"], axis=1)
    return jnp.einsum("tk,nk->tn", x, w.reshape(n, k).astype(x.dtype))


def group_abstract(model: nnx.Module, layouts: dict[tuple, GroupLayout]) -> nnx.Module:
    """Make the Dense layers named in `layouts` (by their module path) grouped: the kernel
    [K, N] becomes codes [N, K or K / 2] + scale [N, K / G] (+ zero, offset) with the kernel's
    logical axes reversed, and perm [K] replicated, so weights.load_weights fills them and
    sharding places each shard's rows or columns as it would the kernel's."""
    from tgix.models.layers import Dense

    for path, module in nnx.iter_modules(model):
        layout = layouts.get(tuple(path))
        if layout is None:
            continue
        if not isinstance(module, Dense) or module.kernel is None:
            raise ValueError(f"{'.'.join(map(str, path))} is not a float Dense layer")
        k_in, n_out = module.kernel.shape
        axes = module.kernel.axes[::-1]
        width = k_in // 2 if layout.packed else k_in
        param = lambda shape, dtype, axes: nnx.data(
            nnx.Param(jax.ShapeDtypeStruct(shape, dtype), axes=axes)
        )
        module.codes = param((n_out, width), jnp.uint8, axes)
        module.scale = param((n_out, k_in // layout.group), jnp.float32, axes)
        if layout.zero:
            module.zero = param((n_out, k_in // layout.group), jnp.float32, axes)
        if layout.offset:
            module.offset = param((n_out, k_in // layout.group), jnp.float32, axes)
        if layout.perm:
            module.perm = param((k_in,), jnp.int32, ("act_order",))  # replicated
        module.kernel = nnx.data(None)
        module.grouped = layout
    return model


def codebook_group(k: int) -> int:
    """Inputs per absmax block of a 4-bit codebook layer: bitsandbytes' 64 when it divides
    the row, else the largest divisor of K below it (blocks never span rows, so shards of a
    row-parallel layer hold whole blocks)."""
    return max(g for g in range(1, 65) if k % g == 0)


def quantize_codebook(w: np.ndarray, codebook: str, group: int) -> GroupedWeight:
    """A float weight [N, K] -> 4-bit codebook codes with one absmax per block of `group`
    inputs: code = the book value nearest w / absmax (an all-zero block gets scale 1)."""
    book = CODEBOOKS[codebook]
    n, k = w.shape
    blocks = np.asarray(w, np.float32).reshape(n, k // group, group)
    absmax = np.abs(blocks).max(-1)
    scale = np.where(absmax > 0, absmax, 1.0).astype(np.float32)
    order = np.argsort(book, kind="stable")
    ascending = book[order]
    nearest = np.searchsorted((ascending[1:] + ascending[:-1]) / 2, blocks / scale[..., None])
    codes = order[nearest].astype(np.uint8).reshape(n, k)
    return GroupedWeight(codes, scale, 4, codebook=codebook)


def codebook_abstract(model: nnx.Module, method: str) -> nnx.Module:
    """group_abstract for load-time 4-bit (`--quantize bitsandbytes-nf4/-fp4`): every float
    Dense becomes a codebook layer, blocks of codebook_group(K)."""
    from tgix.models.layers import Dense

    layouts = {}
    for path, module in nnx.iter_modules(model):
        if isinstance(module, Dense) and module.kernel is not None:
            k = module.kernel.shape[0]
            layout = GroupLayout(
                4, codebook_group(k), False, False, False, CODEBOOK_METHODS[method]
            )
            layouts[tuple(path)] = layout
    return group_abstract(model, layouts)
