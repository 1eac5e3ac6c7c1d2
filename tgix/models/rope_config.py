"""RopeConfig: transformers' `rope_scaling` / `rope_parameters` merged into one record.

Read by ModelConfig.from_hf (tgix/models/config.py); the frequencies are computed in
tgix/models/layers.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

RopeType = Literal["default", "linear", "dynamic", "llama3", "yarn", "longrope"]

_ROPE_KEYS: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings"},
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings"},
}
_ROPE_OPTIONAL = {
    "yarn": {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"attention_factor", "factor"},
}


class UnsupportedModelError(ValueError):
    """The checkpoint asks for an architecture or option tgix does not implement."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RopeConfig:
    """Rotary embedding settings, after HF's `rope_scaling`/`rope_parameters` are merged."""

    rope_type: RopeType = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int | None = None
    attention_factor: float | None = None  # yarn/longrope: scales cos/sin; None = derived
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors [rotary_dim / 2]
    long_factor: tuple[float, ...] = ()  # used once a row's KV outgrows original_max_position


def rope_from_hf(params: dict[str, Any], hf: dict[str, Any], rotary_dim: int) -> RopeConfig:
    """One RopeConfig from a rope parameter dict (`rope_scaling` merged with
    `rope_parameters`, or one layer type's entry of them) and the top-level config `hf`
    (for `rope_theta`, `max_position_embeddings` and `original_max_position_embeddings`)."""
    params = dict(params)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported; supported: {sorted(_ROPE_KEYS)}"
        )
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope_type in ("llama3", "yarn", "longrope"):  # transformers' pretraining-length fallbacks
        params.setdefault(
            "original_max_position_embeddings",
            hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings"),
        )
        original = params["original_max_position_embeddings"]
        longest = hf.get("max_position_embeddings")
        if rope_type in ("yarn", "longrope") and params.get("factor") is None and original:
            params["factor"] = (longest or original) / original
    missing = sorted(k for k in _ROPE_KEYS[rope_type] if params.get(k) is None)
    if missing:
        raise UnsupportedModelError(f"rope type {rope_type!r} needs {missing}")
    known = _ROPE_KEYS[rope_type] | _ROPE_OPTIONAL.get(rope_type, set())
    unknown = set(params) - known - {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    if unknown:
        raise UnsupportedModelError(
            f"rope option(s) {sorted(unknown)} for {rope_type!r} not supported"
        )
    if rotary_dim % 2:
        raise UnsupportedModelError(f"rotary dim {rotary_dim} must be even for rotary embeddings")
    for key in ("short_factor", "long_factor"):
        if key in params and len(params[key]) != rotary_dim // 2:
            raise UnsupportedModelError(
                f"rope {key} has {len(params[key])} entries for rotary dim {rotary_dim}"
            )
    opt = lambda key: None if params.get(key) is None else float(params[key])
    original = params.get("original_max_position_embeddings")
    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=None if original is None else int(original),
        attention_factor=opt("attention_factor"),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        short_factor=tuple(float(f) for f in params.get("short_factor", ())),
        long_factor=tuple(float(f) for f in params.get("long_factor", ())),
    )


def merged_rope_params(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers 4.x `rope_scaling` updated with 5.x `rope_parameters`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    return params


def yarn_attention_factor(rope: RopeConfig) -> float:
    """The cos/sin scale YaRN applies (transformers' `get_mscale` rule)."""
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def longrope_attention_factor(rope: RopeConfig) -> float:
    """LongRoPE's cos/sin scale: sqrt(1 + ln(factor) / ln(original length)) (transformers)."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(rope.factor) / math.log(rope.original_max_position))


def cos_sin_scale(rope: RopeConfig) -> float:
    """The factor cos and sin are multiplied by (1 except for yarn and longrope)."""
    if rope.rope_type == "yarn":
        return yarn_attention_factor(rope)
    if rope.rope_type == "longrope":
        return longrope_attention_factor(rope)
    return 1.0
