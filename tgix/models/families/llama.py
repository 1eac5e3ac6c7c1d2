"""Llama 2/3/3.1/3.2, SmolLM, Mistral, Qwen2, Qwen3, and Qwen2.5-VL's decoder (Qwen2 with
M-RoPE: three position rows, tgix/models/layers.mrope_cos_sin): the shared decoder as it is."""

from __future__ import annotations

from typing import Any

from tgix.models.families.base import Family, llama_rope, window_per_layer
from tgix.models.rope_config import merged_rope_params, rope_from_hf


def qwen_windows(hf: dict[str, Any], num_layers: int):
    """Qwen2/3 slide only with use_sliding_window, on layers from max_window_layers on."""
    if not hf.get("use_sliding_window", False):
        return (None,) * num_layers
    first = int(hf.get("max_window_layers", num_layers))
    default = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return window_per_layer(hf, num_layers, default)


def _qwen(model_type: str, switches: dict[str, Any], more=lambda hf: {}, rope=llama_rope):
    return Family(model_types=(model_type,), sliding_windows=qwen_windows, rope=rope,
                  switches=lambda hf: {**switches, **more(hf)})  # fmt: skip


def mrope_rope(hf: dict[str, Any], rotary_dim: int):
    """The rope under M-RoPE's split: transformers reads type "mrope" as the default rope."""
    params = merged_rope_params(hf)
    params.pop("mrope_section", None)
    if params.get("rope_type", params.get("type")) == "mrope":
        params["rope_type"] = "default"
    params.pop("type", None)
    return rope_from_hf(params, hf, rotary_dim), None


def mrope_section(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen2.5-VL: the rope's frequency slots split over (time, height, width) rows."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    section = params.get("mrope_section")
    return {"mrope_section": tuple(int(s) for s in section)} if section else {}


FAMILIES = (
    Family(model_types=("llama", "mistral")),
    _qwen("qwen2", {"qkv_bias": True}),
    _qwen("qwen3", {"qk_norm": True}),
    _qwen("qwen2_5_vl_text", {"qkv_bias": True}, mrope_section, mrope_rope),
)
