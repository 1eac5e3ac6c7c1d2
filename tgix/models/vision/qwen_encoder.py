"""Qwen2.5-VL's tower as the engine runs it: compiled per bucket of patch count.

A prompt's images are L patches in all (the processor's pixel_values [L, C*T*p*p] and grids
[n, 3]). L is padded up to a power of two L_b by one extra image of zero pixels, grid
(1, 2, (L_b - L) / 2), which attends only to itself (its own full-attention segment and
windows) and whose merged tokens come last and are dropped. The index arrays get fixed
lengths too: the cumulative window and image lengths are padded with L_b (empty segments
past the end), so one executable serves every mix of images up to L_b patches. Buckets up
to `max_patches` compile at start-up; a larger prompt compiles its bucket on first use.
"""

from __future__ import annotations

import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.models.vision.qwen2_5_vl import Qwen25Vision, vision_inputs

logger = logging.getLogger(__name__)

MIN_BUCKET = 64  # patches


def patch_buckets(max_patches: int) -> tuple[int, ...]:
    out = [MIN_BUCKET]
    while out[-1] < max_patches:
        out.append(out[-1] * 2)
    return tuple(out)


class QwenImageEncoder:
    """`__call__(pixels)`: the processor's pixel_values [L, d] and image_grid_thw [n, 3] ->
    image embeddings [L / merge**2, D] float32, image after image (thread-safe)."""

    def __init__(self, vision: Qwen25Vision, *, max_patches: int = 1024):
        self.vision = vision
        self.cfg = vision.cfg
        self.max_patches = max_patches
        self._graphdef, self._state = nnx.split(vision)
        self._compiled: dict[int, object] = {}
        self._lock = threading.Lock()

    def compile_all(self) -> None:
        for bucket in patch_buckets(self.max_patches):
            self._program(bucket)

    def _program(self, bucket: int):
        with self._lock:
            compiled = self._compiled.get(bucket)
        if compiled is not None:
            return compiled
        if bucket > self.max_patches:
            logger.warning("compiling the image encoder for %d patches during serving", bucket)
        segments = bucket // self.cfg.spatial_merge_size**2 + 2  # bound on windows and images

        def run(state, pixels, inputs):
            return nnx.merge(self._graphdef, state)(pixels, **inputs)

        spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32)
        inputs = {
            "window_index": spec((bucket // self.cfg.spatial_merge_size**2,)),
            "cu_window_seqlens": spec((segments,)),
            "cu_seqlens": spec((segments,)),
            "position_ids": spec((bucket, 2)),
        }
        width = self.vision.patch_embed.proj.kernel.shape[0]
        pixels = jax.ShapeDtypeStruct((bucket, width), jnp.float32)
        compiled = jax.jit(run).lower(self._state, pixels, inputs).compile()
        with self._lock:
            self._compiled[bucket] = compiled
        return compiled

    def __call__(self, pixels: dict) -> np.ndarray:
        values = np.asarray(pixels["pixel_values"], np.float32)
        grids = np.asarray(pixels["image_grid_thw"], np.int64).reshape(-1, 3)
        length = len(values)
        bucket = next(b for b in patch_buckets(max(length, self.max_patches)) if b >= length)
        pad = bucket - length
        if pad:  # a padding image of its own: 2 rows of pad / 2 patches
            grids = np.concatenate([grids, [[1, 2, pad // 2]]])
            values = np.concatenate([values, np.zeros((pad, values.shape[1]), np.float32)])
        inputs = vision_inputs(grids, self.cfg)
        segments = bucket // self.cfg.spatial_merge_size**2 + 2
        for key in ("cu_window_seqlens", "cu_seqlens"):
            cu = inputs[key]
            inputs[key] = np.concatenate([cu, np.full(segments - len(cu), bucket, np.int32)])
        out = np.asarray(self._program(bucket)(self._state, values, inputs))
        return out[: length // self.cfg.spatial_merge_size**2]
