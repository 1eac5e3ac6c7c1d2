"""Family: the per-`model_type` rules the shared decoder is built from, with Llama's as the
defaults (tgix/models/families/__init__.py explains the layout)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tgix.models.rope_config import (
    RopeConfig,
    UnsupportedModelError,
    merged_rope_params,
    rope_from_hf,
)
from tgix.models.weight_table import decoder_rows


def llama_rope(hf: dict[str, Any], rotary_dim: int) -> tuple[RopeConfig, RopeConfig | None]:
    """One rope for every layer, from `rope_scaling` / `rope_parameters`."""
    return rope_from_hf(merged_rope_params(hf), hf, rotary_dim), None


def window_per_layer(hf: dict[str, Any], num_layers: int, default_types=None):
    """Per-layer window from `sliding_window` and `layer_types` (or `default_types`, a list
    of "sliding_attention"/"full_attention", when the config has none; None: every layer
    slides). No window: (None,) * L."""
    window = hf.get("sliding_window")
    if not window:
        return (None,) * num_layers
    layer_types = hf.get("layer_types") or default_types
    if layer_types is None:
        return (int(window),) * num_layers
    if len(layer_types) != num_layers:
        raise UnsupportedModelError(
            f"layer_types has {len(layer_types)} entries for {num_layers} layers"
        )
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


def no_refusal(hf: dict[str, Any]) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Family:
    """model_types: the `model_type` values it reads. switches(hf) -> ModelConfig fields
    beyond the shared ones. rope(hf, rotary_dim) -> (rope, rope of sliding layers or None).
    sliding_windows(hf, L) -> per-layer window. rows(cfg, kv_repeats) -> the weight table
    (tgix/models/weight_table.py). activations: the hidden_act values it allows.
    partial_rotary: whether partial_rotary_factor < 1 is read (else refused). refuse(hf):
    raises UnsupportedModelError for options the family has and tgix does not."""

    model_types: tuple[str, ...]
    rows: Callable = decoder_rows
    switches: Callable[[dict[str, Any]], dict[str, Any]] = lambda hf: {}
    rope: Callable = llama_rope
    sliding_windows: Callable = window_per_layer
    activations: tuple[str, ...] = ("silu",)
    partial_rotary: bool = False
    refuse: Callable[[dict[str, Any]], None] = no_refusal
