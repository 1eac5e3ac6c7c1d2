"""Llama 2/3/3.1/3.2, SmolLM, Mistral, Qwen2, Qwen3: the shared decoder as it is."""

from __future__ import annotations

from typing import Any

from tgix.models.families.base import Family, window_per_layer


def qwen_windows(hf: dict[str, Any], num_layers: int):
    """Qwen2/3 slide only with use_sliding_window, on layers from max_window_layers on."""
    if not hf.get("use_sliding_window", False):
        return (None,) * num_layers
    first = int(hf.get("max_window_layers", num_layers))
    default = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return window_per_layer(hf, num_layers, default)


def _qwen(model_type: str, switches: dict[str, Any]) -> Family:
    return Family(model_types=(model_type,), sliding_windows=qwen_windows,
                  switches=lambda hf: switches)  # fmt: skip


FAMILIES = (
    Family(model_types=("llama", "mistral")),
    _qwen("qwen2", {"qkv_bias": True}),
    _qwen("qwen3", {"qk_norm": True}),
)
