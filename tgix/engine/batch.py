"""HostStep: one step as the host sends it (numpy). Its metadata arrays come from the model's
attention backend (`pack`: tgix.attention.pack for the page layout)."""

from __future__ import annotations

import dataclasses

import numpy as np

from tgix.engine.buckets import StepShape


@dataclasses.dataclass(frozen=True)
class HostStep:
    """One step packed on the host (numpy), padded to its bucket: what `dispatch` sends to
    the device, and what process 0 of a group sends to the others (small: ids, metadata,
    sampling settings, grammar words)."""

    shape: StepShape
    history_len: int
    token_ids: np.ndarray  # [T] int32
    metadata: dict[str, np.ndarray]  # AttentionMetadata fields
    logits_indices: np.ndarray  # [R] int32
    sampling: dict[str, np.ndarray]  # SamplingArrays fields, [R] each
    positions: np.ndarray  # [R] int32
    history: np.ndarray  # [R, L] int32
    masks: np.ndarray | None  # [R, W] uint32 grammar words, or None
    # what some models' steps take besides: "image_embeds" [T, D] float32 and "image_marks"
    # [T] bool (a shape with images), "rope_positions" [3, T] int32 (an M-RoPE model)
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
