"""Idefics3 / SmolVLM vision side (transformers' Idefics3VisionTransformer + Idefics3Connector).

Shapes: N tiles (the processor's images after splitting; a tile is one image to the encoder),
C channels, H x W pixels, P = (H / p) * (W / p) patches of p x p pixels, D the vision width,
F its MLP width, s the connector's scale factor, Q = P / s**2 image tokens per tile, E the
text model's width. Attribute paths mirror transformers' module names (vision_model.
embeddings.patch_embedding, ..., connector.modality_projection.proj), so each checkpoint
tensor is its path with `kernel` read as `weight` (transposed) under a `model.` prefix.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.models.checkpoint import CheckpointError, SafetensorsSource
from tgix.models.layers import Dense

MODEL_TYPES = ("idefics3", "smolvlm")
QUERY_BLOCK = 256  # queries per attention block
_ERF_GELU = lambda x: jax.nn.gelu(x, approximate=False)  # torch's "gelu"
_ACTIVATIONS = {"gelu_pytorch_tanh": jax.nn.gelu, "gelu_new": jax.nn.gelu, "gelu": _ERF_GELU}


@dataclasses.dataclass(frozen=True)
class Idefics3VisionConfig:
    """The vision side's fields of an idefics3 / smolvlm config.json (transformers' defaults)."""

    hidden_size: int = 1152
    intermediate_size: int = 3072
    num_layers: int = 12
    num_heads: int = 16
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    scale_factor: int = 2
    text_hidden_size: int = 4096
    image_token_id: int = 128257

    @classmethod
    def from_hf(cls, config: dict) -> Idefics3VisionConfig:
        """From the top-level config.json dict (vision_config, scale_factor, text_config)."""
        if config.get("model_type") not in MODEL_TYPES:
            raise ValueError(f"model_type {config.get('model_type')!r} is not one of {MODEL_TYPES}")
        vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
        if vision.get("hidden_act", cls.hidden_act) not in _ACTIVATIONS:
            raise ValueError(f"vision hidden_act {vision['hidden_act']!r} is not supported")
        renames = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}
        fields = {
            f.name: vision[renames.get(f.name, f.name)]
            for f in dataclasses.fields(cls)
            if renames.get(f.name, f.name) in vision
        }
        fields |= {k: config[k] for k in ("scale_factor", "image_token_id") if k in config}
        fields |= {"text_hidden_size": text["hidden_size"]} if "hidden_size" in text else {}
        return cls(**fields)

    @property
    def num_patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        """The processor's image_seq_len: image tokens per full tile."""
        return self.num_patches_per_side**2 // self.scale_factor**2


class LayerNorm(nnx.Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float32."""

    def __init__(self, size: int, eps: float, *, dtype):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((size,), dtype), axes=("norm",))
        self.bias = nnx.Param(jnp.zeros((size,), dtype), axes=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        y = centered * jax.lax.rsqrt(jnp.mean(centered**2, axis=-1, keepdims=True) + self.eps)
        return (y * self.weight[...].astype(jnp.float32) + self.bias[...]).astype(x.dtype)


def _dense(d_in: int, d_out: int, *, bias: bool, rngs, dtype) -> Dense:
    """A replicated [d_in, d_out] linear layer on rows [T, d_in] (T = N * P)."""
    return Dense("td,df->tf", (d_in, d_out), ("embed", "embed"), bias=bias, rngs=rngs, dtype=dtype)


class Modules(nnx.Module):
    """Named submodules or parameters (transformers' containers: encoder, mlp, ...)."""

    def __init__(self, **children):
        for name, child in children.items():
            setattr(self, name, child)


class VisionEmbeddings(nnx.Module):
    """Patch embedding (the stride-p conv as a matmul on flattened (c, y, x) patches: kernel
    [C * p * p, D]) plus the NaViT position embedding of each patch."""

    def __init__(self, cfg: Idefics3VisionConfig, *, rngs, dtype):
        self.patch_size = cfg.patch_size
        k = cfg.num_channels * cfg.patch_size**2
        self.patch_embedding = _dense(k, cfg.hidden_size, bias=True, rngs=rngs, dtype=dtype)
        table = jax.random.normal(rngs.params(), (cfg.num_patches_per_side**2, cfg.hidden_size))
        self.position_embedding = Modules(
            weight=nnx.Param(table.astype(dtype), axes=("embed",) * 2)
        )

    def __call__(self, pixel_values: jax.Array, position_ids: jax.Array) -> jax.Array:
        """[N, C, H, W], [N, P] -> [N * P, D]; pixels past the last whole patch are dropped."""
        n, c, h, w = pixel_values.shape
        p = self.patch_size
        x = pixel_values[:, :, : h // p * p, : w // p * p].reshape(n, c, h // p, p, w // p, p)
        x = x.transpose(0, 2, 4, 1, 3, 5).reshape(n * (h // p) * (w // p), c * p * p)
        x = self.patch_embedding(x.astype(self.patch_embedding.kernel.dtype))
        return x + jnp.take(self.position_embedding.weight[...], position_ids.reshape(-1), axis=0)


class VisionAttention(nnx.Module):
    """Bidirectional attention within each tile; padded patches are masked out as keys only
    (they still attend, as queries, like transformers' bidirectional mask)."""

    def __init__(self, cfg: Idefics3VisionConfig, *, rngs, dtype):
        d = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, d // cfg.num_heads
        for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            setattr(self, name, _dense(d, d, bias=True, rngs=rngs, dtype=dtype))

    def __call__(self, x: jax.Array, patch_mask: jax.Array) -> jax.Array:
        """x [N * P, D], patch_mask [N, P] bool -> [N * P, D]. Queries in blocks of QUERY_BLOCK
        (a lax.map): a block's scores [N, heads, B, P] stay in cache (XLA:CPU, P = 1024: 26
        ms a layer against 71 for the whole [N, heads, P, P] at once)."""
        n, p = patch_mask.shape
        shape = (n, p, self.num_heads, self.head_dim)
        q, k, v = (proj(x).reshape(shape) for proj in (self.q_proj, self.k_proj, self.v_proj))
        q = (q * self.head_dim**-0.5).transpose(0, 2, 1, 3)  # [N, h, P, k]
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)  # [N, h, k, P], [N, h, P, k]
        bias = jnp.where(patch_mask, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :]

        def block(qb):  # [N, h, B, k] -> [N, h, B, k]
            scores = jnp.matmul(qb, k, preferred_element_type=jnp.float32) + bias
            weights = jnp.exp(scores - scores.max(-1, keepdims=True))
            out = jnp.matmul(weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
            return (out / weights.sum(-1, keepdims=True)).astype(v.dtype)

        size = next((b for b in (QUERY_BLOCK, 128, 64) if p % b == 0 and b < p), p)
        blocks = q.reshape(n, self.num_heads, p // size, size, self.head_dim)
        out = jax.lax.map(block, blocks.transpose(2, 0, 1, 3, 4))  # [P/B, N, h, B, k]
        out = out.transpose(1, 0, 3, 2, 4).reshape(n * p, -1)  # [N * P, h * k]
        return self.out_proj(out)


class EncoderLayer(nnx.Module):
    """Pre-norm block on rows [N * P, D]: x + attn(ln1(x)), then x + fc2(act(fc1(ln2(x))))."""

    def __init__(self, cfg: Idefics3VisionConfig, *, rngs, dtype):
        d, f, eps = cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps
        self.act = cfg.hidden_act
        self.self_attn = VisionAttention(cfg, rngs=rngs, dtype=dtype)
        self.layer_norm1 = LayerNorm(d, eps, dtype=dtype)
        self.mlp = Modules(
            fc1=_dense(d, f, bias=True, rngs=rngs, dtype=dtype),
            fc2=_dense(f, d, bias=True, rngs=rngs, dtype=dtype),
        )
        self.layer_norm2 = LayerNorm(d, eps, dtype=dtype)

    def __call__(self, x: jax.Array, patch_mask: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.layer_norm1(x), patch_mask)
        return x + self.mlp.fc2(_ACTIVATIONS[self.act](self.mlp.fc1(self.layer_norm2(x))))


class Connector(nnx.Module):
    def __init__(self, cfg: Idefics3VisionConfig, *, rngs, dtype):
        self.scale_factor, d_in = cfg.scale_factor, cfg.hidden_size * cfg.scale_factor**2
        proj = _dense(d_in, cfg.text_hidden_size, bias=False, rngs=rngs, dtype=dtype)
        self.modality_projection = Modules(proj=proj)

    def __call__(self, x: jax.Array) -> jax.Array:
        """transformers' pixel_shuffle then proj: [N, P, D] -> [N, Q, D * s * s] -> [N, Q, E]."""
        n, p, d = x.shape
        s, side = self.scale_factor, math.isqrt(p)
        x = x.reshape(n, side, side // s, d * s).transpose(0, 2, 1, 3)
        x = x.reshape(n, side // s, side // s, d * s * s).transpose(0, 2, 1, 3)
        x = x.reshape(n * p // s**2, d * s * s)
        return self.modality_projection.proj(x).reshape(n, p // s**2, -1)


class Idefics3Vision(nnx.Module):
    """Tiles -> image features in the text width: encoder, post_layernorm, connector."""

    def __init__(self, cfg: Idefics3VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.config = cfg
        layers = [EncoderLayer(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.num_layers)]
        self.vision_model = Modules(
            embeddings=VisionEmbeddings(cfg, rngs=rngs, dtype=dtype),
            encoder=Modules(layers=nnx.List(layers)),
            post_layernorm=LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype=dtype),
        )
        self.connector = Connector(cfg, rngs=rngs, dtype=dtype)

    def __call__(
        self, pixel_values: jax.Array, position_ids: jax.Array, patch_mask: jax.Array
    ) -> jax.Array:
        """pixel_values [N, C, H, W] (channels first, as the processor returns them; H / p ==
        W / p and divisible by s), position_ids [N, P] int32, patch_mask [N, P] bool (False:
        padding, never attended to) -> [N, Q, E] float32."""
        n, _, h, w = pixel_values.shape
        side, s = h // self.config.patch_size, self.config.scale_factor
        if side != w // self.config.patch_size or side % s:
            raise ValueError(f"tiles of {h}x{w} pixels are not a square grid divisible by {s}")
        vm = self.vision_model
        x = vm.embeddings(pixel_values, position_ids)
        for layer in vm.encoder.layers:
            x = layer(x, patch_mask)
        x = vm.post_layernorm(x).reshape(n, side * side, -1)
        return self.connector(x).astype(jnp.float32)


def _torch_arange(start: float, end: float, step: float) -> np.ndarray:
    """torch.arange(start, end, step) in float32 as its CPU kernel computes it: runs of 16
    as 8-wide vectors from a float32 base (float32(base + j * step)), the tail per element."""
    count = math.ceil((end - start) / step)
    idx = np.arange(count)
    base = (start + step * (idx - idx % 8)).astype(np.float32).astype(np.float64)
    vector = (base + (idx % 8) * step).astype(np.float32)
    scalar = (start + step * idx).astype(np.float32)
    return np.where(idx < count // 16 * 16, vector, scalar)


def real_images(pixel_values: np.ndarray) -> np.ndarray:
    """[N] bool: not an all-zero padding image (Idefics3Model.get_image_features' rule)."""
    return np.any(pixel_values.reshape(len(pixel_values), -1) != 0, axis=1)


def patch_inputs(
    pixel_values: np.ndarray,
    pixel_attention_mask: np.ndarray | None,
    patch_size: int,
    num_patches_per_side: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Host side, for real tiles only (see `real_images`): pixel_values [N, C, H, W] and the
    processor's pixel_attention_mask [N, H, W] (None: all valid) -> position_ids [N, P] int32
    (transformers' bucketized NaViT ids as torch computes them on CPU, float32 rounding and
    all; 0 at padding) and patch_mask [N, P] bool (valid when any of its pixels is)."""
    n, _, h, w = pixel_values.shape
    hp, wp = h // patch_size, w // patch_size
    if pixel_attention_mask is None:
        mask = np.ones((n, hp, wp), bool)
    else:
        m = np.asarray(pixel_attention_mask)[:, : hp * patch_size, : wp * patch_size]
        mask = m.reshape(n, hp, patch_size, wp, patch_size).sum(axis=(2, 4)) > 0
    step = 1 / num_patches_per_side
    boundaries = _torch_arange(step, 1.0, step)
    limit = np.float32(1.0 - 1e-6)

    def buckets(valid: np.ndarray, length: int) -> np.ndarray:  # [N] counts -> [N, length]
        with np.errstate(divide="ignore", invalid="ignore"):  # float32, as torch computes it
            step_valid = 1 / valid.astype(np.float32)
            frac = np.arange(length, dtype=np.float32)[None] * step_valid[:, None]
        return np.searchsorted(boundaries, np.minimum(frac, limit), side="right")

    rows, cols = buckets(mask[:, :, 0].sum(1), hp), buckets(mask[:, 0, :].sum(1), wp)
    ids = (rows[:, :, None] * num_patches_per_side + cols[:, None, :]).reshape(n, hp * wp)
    patch_mask = mask.reshape(n, hp * wp)
    return np.where(patch_mask, ids, 0).astype(np.int32), patch_mask


@nnx.jit
def _encode(vision: Idefics3Vision, pixel_values, position_ids, patch_mask):
    return vision(pixel_values, position_ids, patch_mask)


def image_features(
    vision: Idefics3Vision, pixel_values: np.ndarray, pixel_attention_mask: np.ndarray | None
) -> np.ndarray:
    """The processor's pixel_values [B, I, C, H, W] (or [N, C, H, W]) and pixel_attention_mask
    [B, I, H, W] (or [N, H, W], or None) -> [num_image_tokens, E] float32: each real tile's Q
    features, tiles row-major (sample, then image), the order the `<image>` tokens of the
    prompts take them in. All-zero padding tiles are dropped; none real gives [0, E] (where
    SmolVLM would encode one zero tile that no `<image>` token takes)."""
    cfg = vision.config
    pixels = np.asarray(pixel_values, np.float32).reshape(-1, *np.shape(pixel_values)[-3:])
    real = real_images(pixels)
    if not real.any():
        return np.zeros((0, cfg.text_hidden_size), np.float32)
    mask = None
    if pixel_attention_mask is not None:
        mask = np.asarray(pixel_attention_mask).reshape(-1, *pixels.shape[-2:])[real]
    pixels = pixels[real]
    position_ids, patch_mask = patch_inputs(pixels, mask, cfg.patch_size, cfg.num_patches_per_side)
    out = _encode(vision, jnp.asarray(pixels), jnp.asarray(position_ids), jnp.asarray(patch_mask))
    return np.asarray(out).reshape(-1, cfg.text_hidden_size)


def load_idefics3_vision(path: str | Path, *, dtype=jnp.float32) -> Idefics3Vision:
    """The vision tower and connector of an idefics3 / smolvlm checkpoint folder: tensors
    `model.vision_model.*` and `model.connector.*` (as save_pretrained writes them; the bare
    `vision_model.*` / `connector.*` of an Idefics3Model is read too). Raises CheckpointError
    on a missing, unexpected or misshapen tensor."""
    path = Path(path)
    cfg = Idefics3VisionConfig.from_hf(json.loads((path / "config.json").read_text()))
    source = SafetensorsSource(path)
    names = set(source.names())
    prefix = "model." if "model.vision_model.post_layernorm.weight" in names else ""
    abstract = nnx.eval_shape(lambda: Idefics3Vision(cfg, rngs=nnx.Rngs(0), dtype=dtype))
    graphdef, state = nnx.split(abstract)
    filled, missing, used = [], [], set()
    for key, var in nnx.to_flat_state(state):
        leaf = "weight" if key[-1] == "kernel" else key[-1]
        name = prefix + ".".join(map(str, (*key[:-1], leaf)))
        if name not in names:
            missing.append(name)
            continue
        value = np.asarray(source.read(name), np.float32)
        if key[-1] == "kernel":  # torch [out, in] (the conv: [out, C, p, p]) -> [in, out]
            value = value.reshape(value.shape[0], -1).T
        if value.shape != var.shape:
            raise CheckpointError(f"tensor {name!r} has shape {value.shape}, expected {var.shape}")
        filled.append((key, var.replace(jnp.asarray(value, dtype))))
        used.add(name)
    if missing:
        raise CheckpointError(
            f"{path} lacks {len(missing)} vision tensor(s): {', '.join(missing[:4])}"
        )
    ours = (prefix + "vision_model.", prefix + "connector.")
    unexpected = sorted(n for n in names - used if n.startswith(ours))
    if unexpected:
        raise CheckpointError(f"unexpected vision tensor(s): {', '.join(unexpected[:4])}")
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
