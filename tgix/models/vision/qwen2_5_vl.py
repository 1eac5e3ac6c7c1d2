"""Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel) in NNX.

Shape letters (besides tgix/models/layers.py's):
  L patches of a call (every image's, in the processor's order: per image, per 2x2 merge block)
  U = merge**2 patches per merged token     M = L / U merged tokens (the decoder's image tokens)
  C*T*p*p one patch's pixels (channels x temporal_patch_size x patch x patch)
  Dv the tower's width     N heads     H = Dv / N

Per-image and per-window attention is one attention over all L patches under a block mask
from segment ids (no Python loop over images inside jit); the index arrays come from
`vision_inputs` (host, numpy). The mask is [L, L]: fine for a few images' thousands of
patches; very large images would want a block-sparse kernel. Names mirror transformers'
(`blocks.0.attn.qkv`, `merger.mlp.0`): checkpoint `visual.<path>.weight` -> `<path>.kernel`
(transposed). The decoder tokens' M-RoPE positions are in qwen2_5_vl_rope.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.models.checkpoint import CheckpointError, SafetensorsSource
from tgix.models.layers import ACTIVATIONS, Dense, RMSNorm, apply_rope

_EPS = 1e-6  # transformers hard-codes the tower's RMSNorm eps
_PREFIXES = ("visual.", "model.visual.")  # transformers' save_pretrained writes `visual.`
_AXES = ("embed", "embed")  # the fused qkv, proj and patch embedding: replicated


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Qwen25VisionConfig:
    """The vision tower's fields of a Qwen2.5-VL config.json, plus the token ids M-RoPE needs."""

    depth: int
    hidden_size: int  # Dv
    intermediate_size: int
    num_heads: int  # N
    out_hidden_size: int  # the decoder's D
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112  # in pixels: window_size // merge // patch merged tokens a side
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652

    @classmethod
    def from_hf(cls, config: dict) -> Qwen25VisionConfig:
        """From the top-level config.json dict (transformers 4 or 5 layout)."""
        v = dict(config["vision_config"])
        v.setdefault("in_channels", v.get("in_chans", 3))  # transformers 4's name
        v["rope_theta"] = float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        v["hidden_act"] = {"swish": "silu"}.get(v.get("hidden_act", "silu"), v.get("hidden_act"))
        if v["hidden_act"] not in ACTIVATIONS:
            raise ValueError(f"vision hidden_act {v['hidden_act']!r} is not supported")
        tokens = ("image_token_id", "video_token_id", "vision_start_token_id")
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v[k] for k in fields if k in v} | {k: config[k] for k in tokens if k in config}
        if "fullatt_block_indexes" in kw:
            kw["fullatt_block_indexes"] = tuple(kw["fullatt_block_indexes"])
        return cls(**kw)


def vision_inputs(grid_thw: np.ndarray, config: Qwen25VisionConfig) -> dict[str, np.ndarray]:
    """Host index arrays for one call over the images of `grid_thw` [n, 3] (t, h, w patches
    per image, the processor's image_grid_thw), as transformers' vision_utils computes them:

      window_index [M] int32: merged tokens in window order (window_index[i] = the token
                              of the processor's order at window position i)
      cu_window_seqlens [W + 1] int32: patch offsets of the W windows (in window order)
      cu_seqlens [n_frames + 1] int32: patch offsets of each image (frame): full attention
      position_ids [L, 2] int32: each patch's (row, column) in its image, in window order
    """
    grid_thw = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    m = config.spatial_merge_size
    win = config.window_size // m // config.patch_size  # merged tokens per window side
    window_index, cu_window, cu_full, positions = [], [0], [0], []
    offset = 0
    for t, h, w in grid_thw.tolist():
        gh, gw = h // m, w // m
        padded = np.full((t, -(-gh // win) * win, -(-gw // win) * win), -1, np.int64)
        padded[:, :gh, :gw] = np.arange(t * gh * gw).reshape(t, gh, gw)
        nh, nw = padded.shape[1] // win, padded.shape[2] // win
        windows = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(-1, win**2)
        window_index.append(windows[windows >= 0] + offset)
        cu_window.extend(cu_window[-1] + np.cumsum((windows >= 0).sum(-1)) * m * m)
        cu_full.extend(cu_full[-1] + h * w * np.arange(1, t + 1))
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        blocks = [a.reshape(gh, m, gw, m).transpose(0, 2, 1, 3).reshape(-1) for a in (rows, cols)]
        positions.append(np.tile(np.stack(blocks, -1), (t, 1)))
        offset += t * gh * gw
    index = np.concatenate(window_index).astype(np.int32)
    pos = np.concatenate(positions).reshape(len(index), m * m, 2)[index].reshape(-1, 2)
    return {
        "window_index": index,
        "cu_window_seqlens": np.asarray(cu_window, np.int32),
        "cu_seqlens": np.asarray(cu_full, np.int32),
        "position_ids": pos.astype(np.int32),
    }


class Qwen25VisionPatchEmbed(nnx.Module):
    """The Conv3d with kernel == stride over one patch is a matmul: [L, C*T*p*p] -> [L, Dv]."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs, dtype):
        k = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        self.proj = Dense(
            "tk,kd->td", (k, cfg.hidden_size), _AXES, bias=False, rngs=rngs, dtype=dtype
        )

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        return self.proj(pixel_values.astype(self.proj.kernel.dtype))


class Qwen25VisionAttention(nnx.Module):
    """Fused qkv [Dv, 3 Dv] -> 2-D rope on q, k -> attention where `allowed` [L, L] -> proj."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs, dtype):
        d, self.num_heads = cfg.hidden_size, cfg.num_heads
        self.qkv = Dense("td,dk->tk", (d, 3 * d), _AXES, bias=True, rngs=rngs, dtype=dtype)
        self.proj = Dense("td,de->te", (d, d), _AXES, bias=True, rngs=rngs, dtype=dtype)

    def __call__(self, x, cos, sin, allowed):
        length = x.shape[0]
        q, k, v = jnp.moveaxis(self.qkv(x).reshape(length, 3, self.num_heads, -1), 1, 0)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [L, N, H]
        scores = jnp.einsum("qnh,knh->nqk", q, k).astype(jnp.float32) * q.shape[-1] ** -0.5
        scores = jnp.where(allowed[None], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.proj(jnp.einsum("nqk,knh->qnh", probs, v).reshape(length, -1))


class Qwen25VisionMLP(nnx.Module):
    """down(act(gate(x)) * up(x)), every projection with a bias: [L, Dv] -> [L, F] -> [L, Dv]."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs, dtype):
        d, f, self.act = cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act
        kw = {"bias": True, "rngs": rngs, "dtype": dtype}
        self.gate_proj = Dense("td,df->tf", (d, f), ("embed", "mlp"), **kw)
        self.up_proj = Dense("td,df->tf", (d, f), ("embed", "mlp"), **kw)
        self.down_proj = Dense("tf,fd->td", (f, d), ("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.down_proj(ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x))


class Qwen25VisionBlock(nnx.Module):
    """Pre-norm residual block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs, dtype):
        self.norm1 = RMSNorm(cfg.hidden_size, _EPS, dtype=dtype)
        self.norm2 = RMSNorm(cfg.hidden_size, _EPS, dtype=dtype)
        self.attn = Qwen25VisionAttention(cfg, rngs=rngs, dtype=dtype)
        self.mlp = Qwen25VisionMLP(cfg, rngs=rngs, dtype=dtype)

    def __call__(self, x, cos, sin, allowed):
        x = x + self.attn(self.norm1(x), cos, sin, allowed)
        return x + self.mlp(self.norm2(x))


class _GELU(nnx.Module):
    """nn.GELU() (exact erf), a parameterless slot so `merger.mlp` indexes as transformers'."""

    def __call__(self, x):
        return jax.nn.gelu(x, approximate=False)


class Qwen25VisionPatchMerger(nnx.Module):
    """ln_q over Dv, U neighbouring patches concatenated, MLP: [L, Dv] -> [M, U Dv] -> [M, D]."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs, dtype):
        wide = cfg.hidden_size * cfg.spatial_merge_size**2
        kw = {"bias": True, "rngs": rngs, "dtype": dtype}
        self.ln_q = RMSNorm(cfg.hidden_size, _EPS, dtype=dtype)
        self.mlp = nnx.List(
            [
                Dense("tk,kf->tf", (wide, wide), ("embed", "mlp"), **kw),
                _GELU(),
                Dense("tf,fd->td", (wide, cfg.out_hidden_size), ("mlp", "embed"), **kw),
            ]
        )

    def __call__(self, x):
        x = self.ln_q(x).reshape(-1, self.mlp[0].kernel.shape[0])
        for layer in self.mlp:
            x = layer(x)
        return x


def _same_segment(cu_seqlens: jax.Array, length: int) -> jax.Array:
    """[L, L] block mask: the patches in one segment of cumulative lengths [S + 1]."""
    segment = jnp.searchsorted(cu_seqlens, jnp.arange(length), side="right") - 1  # [L]
    return segment[:, None] == segment[None, :]


class Qwen25Vision(nnx.Module):
    """Patch embed -> blocks (window attention, full attention at fullatt_block_indexes) ->
    patch merger, over every image of a call at once."""

    def __init__(self, cfg: Qwen25VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.cfg = cfg
        self.patch_embed = Qwen25VisionPatchEmbed(cfg, rngs=rngs, dtype=dtype)
        self.blocks = nnx.List(
            [Qwen25VisionBlock(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.depth)]
        )
        self.merger = Qwen25VisionPatchMerger(cfg, rngs=rngs, dtype=dtype)

    def rope(self, position_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """cos, sin [L, H] (float32) from (row, column) ids [L, 2]: H/4 frequencies per axis,
        rows then columns, doubled for rotate-half."""
        half = self.cfg.hidden_size // self.cfg.num_heads // 2
        inv_freq = 1.0 / self.cfg.rope_theta ** (np.arange(0, half, 2, dtype=np.float32) / half)
        angles = position_ids.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)  # [L,2,H/4]
        angles = angles.reshape(angles.shape[0], -1)  # [L, H/2]: rows then columns
        angles = jnp.concatenate([angles, angles], axis=-1)
        return jnp.cos(angles), jnp.sin(angles)

    def __call__(
        self,
        pixel_values: jax.Array,
        *,
        window_index: jax.Array,
        cu_window_seqlens: jax.Array,
        cu_seqlens: jax.Array,
        position_ids: jax.Array,
    ) -> jax.Array:
        """pixel_values [L, C*T*p*p] (the processor's, every image concatenated) and
        `vision_inputs`' arrays -> image embeddings [M, D], image after image."""
        unit = self.cfg.spatial_merge_size**2
        x = self.patch_embed(pixel_values)  # [L, Dv]
        length, width = x.shape
        x = x.reshape(-1, unit, width)[window_index].reshape(length, width)  # window order
        cos, sin = self.rope(position_ids)
        window_mask = _same_segment(cu_window_seqlens, length)
        full_mask = _same_segment(cu_seqlens, length)
        full_blocks = set(self.cfg.fullatt_block_indexes)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full_mask if i in full_blocks else window_mask)
        merged = self.merger(x)  # [M, D], window order
        return jnp.zeros_like(merged).at[window_index].set(merged)  # the processor's order


def encode_images(model: Qwen25Vision, pixel_values, grid_thw) -> jax.Array:
    """Image embeddings [M, D] of one processor output (jitted per shape)."""
    inputs = vision_inputs(np.asarray(grid_thw), model.cfg)
    return _forward(model, jnp.asarray(pixel_values, jnp.float32), inputs)


@nnx.jit
def _forward(model: Qwen25Vision, pixel_values, inputs):
    return model(pixel_values, **inputs)


def _hf_name(path: tuple) -> str:
    """NNX parameter path -> the checkpoint name after the prefix (kernel -> weight)."""
    *module, leaf = (str(p) for p in path)
    return ".".join([*module, "weight" if leaf == "kernel" else leaf])


def load_qwen25_vision(path: str | Path, *, dtype=jnp.float32) -> Qwen25Vision:
    """The vision tower of a Qwen2.5-VL checkpoint folder (config.json + safetensors; tensors
    `visual.*`, or `model.visual.*`). Raises CheckpointError naming missing, unexpected or
    misshapen tensors."""
    path = Path(path)
    cfg = Qwen25VisionConfig.from_hf(json.loads((path / "config.json").read_text()))
    source = SafetensorsSource(path)
    names = source.names()
    prefix = next((p for p in _PREFIXES if any(n.startswith(p) for n in names)), None)
    if prefix is None:
        raise CheckpointError(f"{path}: no vision tensors (visual.* or model.visual.*)")
    available = {n[len(prefix) :] for n in names if n.startswith(prefix)}
    abstract = nnx.eval_shape(lambda: Qwen25Vision(cfg, rngs=nnx.Rngs(0), dtype=dtype))
    graphdef, state = nnx.split(abstract)
    flat = dict(nnx.to_flat_state(state))
    wanted = {_hf_name(p): p for p in flat}
    missing = sorted(set(wanted) - available)
    unexpected = sorted(available - set(wanted))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: the vision tensors do not fit its config: missing {len(missing)} "
            f"tensor(s) {[prefix + n for n in missing[:8]]}, unexpected {len(unexpected)} "
            f"tensor(s) {[prefix + n for n in unexpected[:8]]}"
        )
    for name, p in wanted.items():
        raw = np.asarray(source.read(prefix + name), np.float32)
        # a kernel: torch's [out, in] (the Conv3d's [out, C, T, p, p]) -> [in, out]
        value = raw.reshape(raw.shape[0], -1).T if p[-1] == "kernel" else raw
        var = flat[p]
        if value.shape != tuple(var.shape):
            raise CheckpointError(
                f"tensor {prefix + name!r} has shape {raw.shape}; expected one mapping to "
                f"{tuple(var.shape)}"
            )
        flat[p] = var.replace(jnp.asarray(value, dtype))
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))
