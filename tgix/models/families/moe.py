"""Mixtral, Qwen3-MoE and Qwen2-MoE: the shared decoder with a routed MoE block
(tgix/models/moe.py) in place of the dense MLP on its sparse layers. Experts are stacked
at load: E tensors per projection -> one [E, D, F] (or [E, F, D]) parameter."""

from __future__ import annotations

from typing import Any

from tgix.models.config import ModelConfig
from tgix.models.families.base import Family
from tgix.models.rope_config import UnsupportedModelError
from tgix.models.weight_table import LAYER, Target, decoder_rows, layer, mlp_rows, row, transpose


def _expert_rows(prefix: str, names: dict[str, str]) -> list:
    """Per-expert tensors `prefix`experts.{e}.{name}.weight -> the stacked kernel `to` (each
    HF [out, in] weight transposed to [in, out] at index e)."""
    return [
        row(prefix + rf"experts\.(\d+)\.{name}\.weight", Target(layer("mlp", to), transpose, True))
        for name, to in names.items()
    ]


def mixtral_rows(cfg: ModelConfig, kv_repeats: int = 1):
    prefix = LAYER + r"block_sparse_moe\."
    names = {"w1": "gate_kernel", "w3": "up_kernel", "w2": "down_kernel"}
    return decoder_rows(cfg, kv_repeats, mlp=False) + [
        row(prefix + r"gate\.weight", Target(layer("mlp", "router"))),
        *_expert_rows(prefix, names),
    ]


def qwen_moe_rows(cfg: ModelConfig, kv_repeats: int = 1):
    """Qwen2/3-MoE: mlp.gate (router), mlp.experts.{e}.*_proj; dense layers (mlp_only_layers,
    decoder_sparse_step) keep mlp.*_proj; Qwen2-MoE's shared expert and its sigmoid gate."""
    prefix = LAYER + r"mlp\."
    names = {"gate_proj": "gate_kernel", "up_proj": "up_kernel", "down_proj": "down_kernel"}
    return decoder_rows(cfg, kv_repeats) + [
        row(prefix + r"gate\.weight", Target(layer("mlp", "router"))),
        *_expert_rows(prefix, names),
        *mlp_rows(prefix + r"shared_expert\.", ("mlp", "shared_expert")),
        row(prefix + r"shared_expert_gate\.weight", Target(layer("mlp", "shared_expert_gate"))),
    ]


def _qwen_moe_windows(hf: dict[str, Any], num_layers: int):
    """transformers slides every Qwen3-MoE layer and Qwen2-MoE's below max_window_layers
    with use_sliding_window, unlike the dense Qwen2/3: refused until served (the public
    checkpoints leave it off)."""
    if hf.get("use_sliding_window", False):
        raise UnsupportedModelError(f"use_sliding_window is not supported for {hf['model_type']}")
    return (None,) * num_layers


def _mixtral(hf: dict[str, Any]) -> dict[str, Any]:
    layers = int(hf["num_hidden_layers"])
    return {
        "num_experts": int(hf["num_local_experts"]),
        "experts_per_token": int(hf["num_experts_per_tok"]),
        "expert_size": int(hf["intermediate_size"]),
        "norm_topk_prob": True,
        "moe_layers": (True,) * layers,
    }


def _qwen_moe(hf: dict[str, Any]) -> dict[str, Any]:
    layers, step = int(hf["num_hidden_layers"]), int(hf.get("decoder_sparse_step", 1))
    dense = set(hf.get("mlp_only_layers") or ())
    experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)  # 4.x, 5.x
    sparse = tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers))
    switches = {
        "num_experts": experts,
        "experts_per_token": int(hf["num_experts_per_tok"]),
        "expert_size": int(hf["moe_intermediate_size"]),
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
        "moe_layers": sparse,
    }
    if hf["model_type"] == "qwen2_moe":
        switches["qkv_bias"] = bool(hf.get("qkv_bias", True))
        switches["shared_expert_size"] = int(hf.get("shared_expert_intermediate_size") or 0)
    else:
        switches["qk_norm"] = True
    return switches


FAMILIES = (
    Family(model_types=("mixtral",), rows=mixtral_rows, switches=_mixtral),
    Family(
        model_types=("qwen3_moe", "qwen2_moe"),
        rows=qwen_moe_rows,
        switches=_qwen_moe,
        sliding_windows=_qwen_moe_windows,
    ),
)
