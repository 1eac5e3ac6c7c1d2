"""Host packing for the on-device sampler (numpy only, no jax): per-request SamplingParams to
the per-row arrays of `sampling.SamplingArrays`, and token histories to a padded [R, L] array.

Shapes: R rows of the step's bucket (padding rows are neutral greedy), L history length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tgix.engine.request import SamplingParams

_NEUTRAL = SamplingParams()
_UINT64_END = 1 << 64


def seed_words(seed: int) -> tuple[int, int]:
    """The uint64 seed as threefry key data (hi, lo): the words jax.random.PRNGKey(seed) uses,
    so the key needs no 64-bit jax."""
    if not 0 <= seed < _UINT64_END:
        raise ValueError(f"seed must be a uint64, got {seed}")
    return seed >> 32, seed & 0xFFFFFFFF


def pack_sampling(params: Sequence[SamplingParams | None], num_rows: int) -> dict[str, np.ndarray]:
    """Arrays named as SamplingArrays' fields, each [R] (seed [R, 2] uint32). None entries and
    rows past len(params) are neutral greedy. `do_sample` is TGI's effective rule (is_sampling),
    so a row that samples must carry a seed (the engine assigns one before packing)."""
    if len(params) > num_rows:
        raise ValueError(f"{len(params)} requests exceed the bucket of {num_rows} rows")
    rows = list(params) + [None] * (num_rows - len(params))
    rows = [p if p is not None else _NEUTRAL for p in rows]
    seeds = np.zeros((num_rows, 2), np.uint32)
    for i, p in enumerate(rows):
        if p.seed is not None:
            seeds[i] = seed_words(p.seed)
        elif p.is_sampling:
            raise ValueError(f"row {i} samples but has no seed (use SamplingParams.with_seed)")

    def column(name: str, dtype) -> np.ndarray:
        return np.array([getattr(p, name) for p in rows], dtype)

    return {
        "do_sample": np.array([p.is_sampling for p in rows], bool),
        "temperature": column("temperature", np.float32),
        "top_k": np.clip(column("top_k", np.int64), 0, np.iinfo(np.int32).max).astype(np.int32),
        "top_p": column("top_p", np.float32),
        "typical_p": column("typical_p", np.float32),
        "repetition_penalty": column("repetition_penalty", np.float32),
        "frequency_penalty": column("frequency_penalty", np.float32),
        "presence_penalty": column("presence_penalty", np.float32),
        "watermark": column("watermark", bool),
        "seed": seeds,
    }


def pack_history(histories: Sequence[Sequence[int]], num_rows: int, length: int) -> np.ndarray:
    """[R, L] int32: each row's ids (prompt + generated) from column 0, the last `length` ids
    when longer, then -1. Rows past len(histories) are all -1. Penalties count the ids; the
    watermark reads the last one, so L = 1 with the previous token suffices without penalties."""
    if len(histories) > num_rows:
        raise ValueError(f"{len(histories)} histories exceed the bucket of {num_rows} rows")
    out = np.full((num_rows, length), -1, np.int32)
    for i, ids in enumerate(histories):
        tail = list(ids)[-length:] if length else []
        out[i, : len(tail)] = tail
    return out
