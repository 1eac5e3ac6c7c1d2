"""Phi-3, Phi-3.5 and Phi-4-mini: fused `qkv_proj` and `gate_up_proj` tensors (split at load
into the shared decoder's q/k/v and gate/up, so each shard takes its own heads and MLP
columns), LongRoPE (short and long factors, switched by length as transformers does:
tgix/models/layers.py) and partial rotary."""

from __future__ import annotations

from tgix.models.config import ModelConfig
from tgix.models.families.base import Family, llama_rope
from tgix.models.weight_table import (
    LAYER,
    Target,
    decoder_rows,
    kv_heads_transform,
    layer,
    row,
)


def phi3_rows(cfg: ModelConfig, kv_repeats: int = 1):
    """The decoder's rows plus the fused tensors, each split into its parts: qkv_proj
    [(N + 2K) * H, D] -> q [N*H], k [K*H], v [K*H] rows; gate_up_proj [2F, D] -> gate, up."""
    nq, nk = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    f = cfg.intermediate_size
    kv = kv_heads_transform(cfg, kv_repeats)
    q_part = lambda w: w[:nq].T
    k_part = lambda w: kv(w[nq : nq + nk])
    v_part = lambda w: kv(w[nq + nk :])
    attn = lambda name: layer("self_attn", name, "kernel")
    mlp = lambda name: layer("mlp", name, "kernel")
    return decoder_rows(cfg, kv_repeats) + [
        row(
            LAYER + r"self_attn\.qkv_proj\.weight",
            Target(attn("q_proj"), q_part),
            Target(attn("k_proj"), k_part),
            Target(attn("v_proj"), v_part),
        ),
        row(
            LAYER + r"mlp\.gate_up_proj\.weight",
            Target(mlp("gate_proj"), lambda w: w[:f].T),
            Target(mlp("up_proj"), lambda w: w[f:].T),
        ),
    ]


def phi3_rope(hf: dict, rotary_dim: int):
    """Phi3Config reads a rope type of "su" or "yarn" as longrope."""
    hf = dict(hf)
    for key in ("rope_scaling", "rope_parameters"):
        params = dict(hf.get(key) or {})
        if params.get("rope_type", params.get("type")) in ("su", "yarn"):
            params.pop("type", None)
            hf[key] = {**params, "rope_type": "longrope"}
    return llama_rope(hf, rotary_dim)


FAMILIES = (Family(model_types=("phi3",), rows=phi3_rows, rope=phi3_rope, partial_rotary=True),)
