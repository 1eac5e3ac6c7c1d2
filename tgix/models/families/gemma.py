"""Gemma 2 and Gemma 3 (text): soft-capped scores and logits (Gemma 2), a query scale of
query_pre_attn_scalar^-0.5, alternating sliding-window layers, GeGLU (tanh GELU), embeddings
times sqrt(D), four norms per block scaling by (1 + weight), and for Gemma 3 q/k norms and
a separate rope for the sliding layers (rope_local_base_freq)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tgix.models.families.base import Family, window_per_layer
from tgix.models.rope_config import UnsupportedModelError, merged_rope_params, rope_from_hf


def _switches(hf: dict[str, Any]) -> dict[str, Any]:
    return {
        "norm_plus_one": True,
        "sandwich_norms": True,
        "embed_scale": float(hf["hidden_size"]) ** 0.5,
        "attn_scale": float(hf.get("query_pre_attn_scalar") or _head_dim(hf)) ** -0.5,
        "attn_softcap": _cap(hf.get("attn_logit_softcapping")),
        "final_softcap": _cap(hf.get("final_logit_softcapping")),
        "qk_norm": hf["model_type"] == "gemma3_text",
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True)),
    }


def _head_dim(hf: dict[str, Any]) -> int:
    return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])


def _cap(value) -> float | None:
    return None if value in (None, 0) else float(value)


def _gemma2_windows(hf: dict[str, Any], num_layers: int):
    """transformers 4.x configs have no layer_types: even layers slide."""
    default = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    return window_per_layer(hf, num_layers, default)


def _gemma3_windows(hf: dict[str, Any], num_layers: int):
    """Every sliding_window_pattern-th layer (1-based) is global, the rest slide."""
    pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6)
    default = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
    return window_per_layer(hf, num_layers, default)


def _gemma3_rope(hf: dict[str, Any], rotary_dim: int):
    """transformers 5: rope_parameters per layer type; 4.x: rope_theta (+ rope_scaling) for
    the global layers and rope_local_base_freq for the sliding ones."""
    params = merged_rope_params(hf)
    if "full_attention" in params or "sliding_attention" in params:
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
    else:  # Gemma 3's global theta defaults to 1e6
        full = {"rope_theta": hf.get("rope_theta", 1e6), **params}
        local = {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 10000.0)}
    return rope_from_hf(full, hf, rotary_dim), rope_from_hf(local, hf, rotary_dim)


def _refuse(hf: dict[str, Any]) -> None:
    if hf.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention (an encoder Gemma) is not served")


GEMMA2 = Family(
    model_types=("gemma2",),
    switches=_switches,
    sliding_windows=_gemma2_windows,
    activations=("gelu_tanh",),
    refuse=_refuse,
)
GEMMA3 = dataclasses.replace(
    GEMMA2, model_types=("gemma3_text",), rope=_gemma3_rope, sliding_windows=_gemma3_windows
)
FAMILIES = (GEMMA2, GEMMA3)
