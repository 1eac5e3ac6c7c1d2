"""Qwen2.5-VL's M-RoPE: 3-D (temporal, height, width) positions of a prompt's tokens (host,
numpy), and the cos/sin they give (jax), as transformers' get_rope_index and
Qwen2_5_VLRotaryEmbedding compute them.

Text tokens advance all three rows by one. An image's U-merged tokens (t, h, w grid of the
processor, h/m x w/m tokens a frame) sit at start + (frame, row, column), and the text after
it starts at start + max(h, w) / m. So positions run behind the token index after an image:
a token generated at index i (>= T, the prompt's length) has position i + delta on all three
rows, with delta = max(positions) + 1 - T (negative or 0). Videos are not supported.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tgix.models.vision.qwen2_5_vl import Qwen25VisionConfig


def mrope_position_ids(
    input_ids: np.ndarray, image_grid_thw: np.ndarray | None, config: Qwen25VisionConfig
) -> tuple[np.ndarray, int]:
    """positions [3, T] int64 of one sequence's tokens `input_ids` [T] and the rope delta
    (int) of the tokens after them. Each image is a run of image_token_id tokens, as many as
    its grid (t * h * w / merge**2; image_grid_thw [n, 3], in order). Raises ValueError when
    the image tokens do not match the grids, NotImplementedError on video tokens."""
    ids = np.asarray(input_ids).reshape(-1)
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw)
    grids = grids.reshape(-1, 3).astype(np.int64)
    if np.any(ids == config.video_token_id):
        raise NotImplementedError("M-RoPE positions of video tokens are not supported")
    m = config.spatial_merge_size
    is_image = ids == config.image_token_id
    sizes = [int(t * (h // m) * (w // m)) for t, h, w in grids]
    if int(is_image.sum()) != sum(sizes):
        raise ValueError(
            f"{int(is_image.sum())} image tokens for images of {sum(sizes)} tokens ({sizes})"
        )
    parts, index, start = [], 0, 0
    for (t, h, w), size in zip(grids.tolist(), sizes, strict=True):
        begin = index + int(np.argmax(is_image[index:]))  # the image's first token
        if not is_image[begin : begin + size].all():
            raise ValueError(f"the image tokens at {begin} are not one run of {size}")
        parts.append(start + np.broadcast_to(np.arange(begin - index), (3, begin - index)))
        start += begin - index
        frame, row, col = np.meshgrid(
            np.arange(t), np.arange(h // m), np.arange(w // m), indexing="ij"
        )
        parts.append(start + np.stack([frame, row, col]).reshape(3, -1))
        start += max(h, w) // m
        index = begin + size
    tail = len(ids) - index
    parts.append(start + np.broadcast_to(np.arange(tail), (3, tail)))
    positions = np.concatenate(parts, axis=1).astype(np.int64)
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return positions, delta


def mrope_cos_sin(
    positions: jax.Array, inv_freq: jax.Array, mrope_section: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
    """cos, sin [T, H] (float32) for positions [3, T] and the decoder's inverse frequencies
    [H/2]: frequency slots split by mrope_section (summing to H/2), the first from the
    temporal row, the next from the height row, the last from the width row; then doubled
    for rotate-half (tgix/models/layers.apply_rope takes them as they are)."""
    if sum(mrope_section) != inv_freq.shape[-1]:
        raise ValueError(f"mrope_section {mrope_section} does not sum to {inv_freq.shape[-1]}")
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [3, T, H/2]
    row = np.repeat(np.arange(len(mrope_section)) % 3, mrope_section)  # [H/2]: its row
    chosen = angles[row, :, np.arange(len(row))].T  # [T, H/2]
    angles = jnp.concatenate([chosen, chosen], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)
