"""The image encoder as the engine runs it: ahead-of-time compiled per bucket of tile count.

A prompt's images reach the encoder as N tiles of C x S x S pixels (S the vision config's
image_size; Idefics3's processor splits every image into such tiles plus a global view).
N is padded up to a power of two (at most MAX_TILES_PER_CALL; more tiles run in several
calls), the padding tiles fully masked, so serving only looks executables up, as the
decoder's steps do. Thread-safe: the validation pool calls it for each prompt with images.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.models.vision.idefics3 import Idefics3Vision, patch_inputs, real_images

MAX_TILES_PER_CALL = 32


def tile_buckets(limit: int = MAX_TILES_PER_CALL) -> tuple[int, ...]:
    out = [1]
    while out[-1] < limit:
        out.append(out[-1] * 2)
    return tuple(out)


class ImageEncoder:
    """`vision` (Idefics3Vision) as compiled executables [n, C, S, S] -> [n, Q, E] per
    bucket n. `__call__(pixels)` takes the processor's arrays for one prompt
    (pixel_values [I, C, H, W], pixel_attention_mask [I, H, W]) and returns the image
    features [num_image_tokens, E] float32 in prompt order."""

    def __init__(self, vision: Idefics3Vision):
        self.vision = vision
        self.cfg = vision.config
        self._graphdef, self._state = nnx.split(vision)
        self._compiled: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def _program(self, n: int, height: int, width: int):
        key = (n, height, width)
        with self._lock:
            compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        patches = (height // self.cfg.patch_size) * (width // self.cfg.patch_size)

        def run(state, pixels, position_ids, patch_mask):
            return nnx.merge(self._graphdef, state)(pixels, position_ids, patch_mask)

        spec = jax.ShapeDtypeStruct
        compiled = (
            jax.jit(run)
            .lower(
                self._state,
                spec((n, self.cfg.num_channels, height, width), jnp.float32),
                spec((n, patches), jnp.int32),
                spec((n, patches), jnp.bool_),
            )
            .compile()
        )
        with self._lock:
            self._compiled[key] = compiled
        return compiled

    def compile_all(self) -> None:
        """Every tile bucket at the configured tile size (what the processor produces)."""
        size = self.cfg.image_size
        for n in tile_buckets():
            self._program(n, size, size)

    def __call__(self, pixels: dict) -> np.ndarray:
        values = np.asarray(pixels["pixel_values"], np.float32)
        values = values.reshape(-1, *values.shape[-3:])
        mask = pixels.get("pixel_attention_mask")
        real = real_images(values)
        values = values[real]
        if mask is not None:
            mask = np.asarray(mask).reshape(-1, *values.shape[-2:])[real]
        position_ids, patch_mask = patch_inputs(
            values, mask, self.cfg.patch_size, self.cfg.num_patches_per_side
        )
        outs = []
        for start in range(0, len(values), MAX_TILES_PER_CALL):
            stop = min(start + MAX_TILES_PER_CALL, len(values))
            outs.append(
                self._run(values[start:stop], position_ids[start:stop], patch_mask[start:stop])
            )
        if not outs:
            return np.zeros((0, self.cfg.text_hidden_size), np.float32)
        return np.concatenate(outs).reshape(-1, self.cfg.text_hidden_size)

    def _run(self, values, position_ids, patch_mask) -> np.ndarray:
        """One call: tiles padded to their bucket with fully masked tiles, cut back after."""
        count = len(values)
        bucket = next(b for b in tile_buckets() if b >= count)
        pad = bucket - count
        if pad:
            values = np.concatenate([values, np.zeros((pad, *values.shape[1:]), np.float32)])
            position_ids = np.concatenate(
                [position_ids, np.zeros((pad, position_ids.shape[1]), np.int32)]
            )
            # a padding tile keeps one valid patch: a row with every key masked would be NaN
            filler = np.zeros((pad, patch_mask.shape[1]), np.bool_)
            filler[:, 0] = True
            patch_mask = np.concatenate([patch_mask, filler])
        program = self._program(bucket, *values.shape[-2:])
        out = program(self._state, values, position_ids, patch_mask)
        return np.asarray(out)[:count]
