"""Decoder building blocks: Dense with logical axes, RMSNorm, rotary embeddings, gated MLP.

Shape letters used in every einsum and shape comment of tgix:
  T tokens of a step (ragged requests packed on one axis)   R requests (rows) of a step
  S KV positions of a row          P pages per row           V vocabulary
  D model width                    F MLP width               L layers
  N query heads                    K KV heads                G = N // K      H head dim
  E experts                        A routed (token, expert) assignments, T * top-k
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.models.config import ModelConfig
from tgix.models.out_major import out_major_matmul
from tgix.models.quant import qmatmul
from tgix.models.quant_group import GroupLayout, grouped_matmul
from tgix.models.rope_config import RopeConfig, cos_sin_scale


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], dtype, std: float):
    """A parameter tagged with logical axes; tgix/sharding/rules.py maps them to the mesh."""
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, axes=axes)


class Dense(nnx.Module):
    """y = einsum(x, kernel) (+ bias), e.g. "td,df->tf" with kernel [D, F]. Out-major (float
    on CPU, tgix/models/out_major.py), the kernel is None and `weight [F, D]` holds it.
    Quantized, the kernel is None and codes hold it: per output channel (tgix/models/quant.py:
    `codes [F, D]` + `scale [F]`) or per group of inputs (tgix/models/quant_group.py,
    `grouped` says what the layer holds: codes, scale [F, D / G], zero, offset, perm)."""

    def __init__(self, spec: str, kernel_shape, kernel_axes, *, bias: bool, rngs, dtype):
        self.spec = spec  # e.g. "td,dnh->tnh"
        num_out = len(spec.split("->")[1]) - 1
        self.kernel = param(
            rngs, kernel_shape, kernel_axes, dtype, np.prod(kernel_shape[:-num_out]) ** -0.5
        )
        self.bias = (
            param(rngs, kernel_shape[-num_out:], kernel_axes[-num_out:], dtype, 0.0)
            if bias
            else None
        )
        self.weight: nnx.Param | None = None  # out-major float [F, D]
        self.codes: nnx.Param | None = None
        self.scale: nnx.Param | None = None
        self.int8_activations = False  # quantized: qmatmul's form (static)
        self.native_int8 = False  # quantized: tgix's int8 CPU kernel (static)
        self.grouped: GroupLayout | None = None  # group-quantized (static)
        self.zero: nnx.Param | None = None
        self.offset: nnx.Param | None = None
        self.perm: nnx.Param | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.grouped is not None:  # every quantized Dense is a 2-D "tk,kn->tn"
            names = ("codes", "scale", "zero", "offset", "perm")
            params = {n: getattr(self, n)[...] for n in names if getattr(self, n) is not None}
            y = grouped_matmul(x, self.grouped, params)
        elif self.weight is not None:
            y = out_major_matmul(x, self.weight[...])
        elif self.kernel is None:
            y = qmatmul(
                x,
                self.codes[...],
                self.scale[...],
                int8_activations=self.int8_activations,
                native=self.native_int8,
            )
        else:
            y = jnp.einsum(self.spec, x, self.kernel[...])
        return y if self.bias is None else y + self.bias[...]


class RMSNorm(nnx.Module):
    """x / rms(x) * weight, normalised in float32 (as transformers does). Llama casts back to
    x's dtype, then scales; Gemma (`plus_one`) scales by (1 + weight) in float32, then casts."""

    def __init__(self, size: int, eps: float, *, dtype, plus_one: bool = False):
        self.eps, self.plus_one = eps, plus_one
        init = jnp.zeros((size,), dtype) if plus_one else jnp.ones((size,), dtype)
        self.weight = nnx.Param(init, axes=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return (x32 * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...] * x32.astype(x.dtype)


def norm(cfg: ModelConfig, size: int, *, dtype) -> RMSNorm:
    """The family's RMSNorm over `size` features."""
    return RMSNorm(size, cfg.rms_norm_eps, dtype=dtype, plus_one=cfg.norm_plus_one)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)): [T, D] -> [T, F] -> [T, D]; act is silu, or tanh GELU
    (GeGLU, Gemma). `width`: F (default intermediate_size)."""

    def __init__(self, cfg: ModelConfig, *, rngs, dtype, width: int | None = None):
        d, f, bias = cfg.hidden_size, width or cfg.intermediate_size, cfg.mlp_bias
        self.hidden_act = cfg.hidden_act
        self.gate_proj = Dense(
            "td,df->tf", (d, f), ("embed", "mlp"), bias=bias, rngs=rngs, dtype=dtype
        )
        self.up_proj = Dense(
            "td,df->tf", (d, f), ("embed", "mlp"), bias=bias, rngs=rngs, dtype=dtype
        )
        self.down_proj = Dense(
            "tf,fd->td", (f, d), ("mlp", "embed"), bias=bias, rngs=rngs, dtype=dtype
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.hidden_act]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


def inv_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """[H/2] inverse frequencies for the static rope types (transformers' rope init rules)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / rope.theta**exponents).astype(np.float32)
    if rope.rope_type == "linear":
        return inv_freq / np.float32(rope.factor)
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(is_medium, smoothed, scaled).astype(np.float32)
    if rope.rope_type == "yarn":
        return _yarn_inv_frequencies(rope, head_dim)
    return inv_freq  # "default", and "dynamic" before the context outgrows max_position


def _yarn_inv_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """YaRN: blend interpolated and extrapolated frequencies with a linear ramp over dims."""
    base, dim, original = rope.theta, head_dim, rope.original_max_position

    def correction_dim(num_rotations: float) -> float:
        return dim * np.log(original / (num_rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = np.floor(low), np.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    inv_extra, inv_inter = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    blended = inv_inter * (1 - extrapolation_weight) + inv_extra * extrapolation_weight
    return blended.astype(np.float32)


def rope_cos_sin(
    cfg: ModelConfig, positions: jax.Array, context_lens: jax.Array, rope: RopeConfig | None = None
) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [T, H'] (float32) for each token's position; H' is the rotary dim
    (H, or its first part with partial rotary). `rope`: default cfg.rope.

    `context_lens` [T] is the KV length of each token's request after this step: "dynamic" NTK
    rope grows its base with it and LongRoPE switches from its short to its long factors
    past original_max_position, exactly as transformers does per forward for one sequence.
    """
    rope = rope or cfg.rope
    dim = cfg.rotary_dim or cfg.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)  # [H'/2]
    if rope.rope_type == "dynamic":
        seq_len = jnp.maximum(context_lens, cfg.max_position).astype(jnp.float32)  # [T]
        scale = rope.factor * seq_len / cfg.max_position - (rope.factor - 1)
        base = rope.theta * scale ** (dim / (dim - 2))  # [T]
        inv_freq = 1.0 / base[:, None] ** jnp.asarray(exponents)[None, :]  # [T, H'/2]
    elif rope.rope_type == "longrope":
        base_powers = (rope.theta**exponents).astype(np.float32)
        short = 1.0 / (np.asarray(rope.short_factor, np.float32) * base_powers)
        long = 1.0 / (np.asarray(rope.long_factor, np.float32) * base_powers)
        is_long = (context_lens > rope.original_max_position)[:, None]  # [T, 1]
        inv_freq = jnp.where(is_long, jnp.asarray(long)[None], jnp.asarray(short)[None])
    else:
        inv_freq = jnp.asarray(inv_frequencies(rope, dim))[None, :]  # [1, H'/2]
    angles = positions.astype(jnp.float32)[:, None] * inv_freq  # [T, H'/2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [T, H']
    scale = cos_sin_scale(rope)
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def mrope_cos_sin(
    cfg: ModelConfig, positions: jax.Array, context_lens: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Qwen2.5-VL's M-RoPE: cos, sin [T, H] for positions [3, T] (time, height, width): the
    rope of each row, frequency slot j taken from the row its mrope_section part names (as
    transformers' Qwen2_5_VLRotaryEmbedding); equal rows give the plain rope."""
    rows = [rope_cos_sin(cfg, positions[r], context_lens) for r in range(3)]  # [T, H] each
    part = np.repeat(np.arange(len(cfg.mrope_section)) % 3, cfg.mrope_section)  # [H/2]
    part = jnp.asarray(np.concatenate([part, part]))  # [H]: the halves rotate together
    pick = lambda i: jnp.where(part == 0, rows[0][i], jnp.where(part == 1, rows[1][i], rows[2][i]))
    return pick(0), pick(1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half rope on [T, heads, H] with cos/sin [T, H'] (H' <= H: partial rotary
    rotates the first H' dims and passes the rest); computed in float32."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return jnp.concatenate([apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]], -1)
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).astype(x.dtype)
