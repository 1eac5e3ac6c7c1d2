"""ModelConfig: the one home of Hugging Face config quirks.

Every other module reads these normalised fields and never looks at a raw `config.json`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Literal

RopeType = Literal["default", "linear", "dynamic", "llama3", "yarn"]

# model_type -> the architecture switches that family always has.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
}
_ROPE_KEYS: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings"},
}
_ROPE_OPTIONAL = {
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
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
    attention_factor: float | None = None  # yarn: scales cos/sin; None = derived from factor
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Normalised decoder config. Shape letters: V D F N K H L (see tgix/models/layers.py)."""

    model_type: str
    vocab_size: int  # V  (vocab_size)
    hidden_size: int  # D  (hidden_size)
    intermediate_size: int  # F  (intermediate_size)
    num_layers: int  # L  (num_hidden_layers)
    num_heads: int  # N  (num_attention_heads)
    num_kv_heads: int  # K  (num_key_value_heads, default N)
    head_dim: int  # H  (head_dim, default D // N)
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    max_position: int = 2048  # max_position_embeddings
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2, or Llama's attention_bias (also sets o_proj bias there)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over H on q and k before rope
    sliding_windows: tuple[int | None, ...] = ()  # per layer; None = full attention
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def group_size(self) -> int:
        """G = N // K query heads share each KV head."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf(json.loads(Path(path).read_text()))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict; raises UnsupportedModelError."""
        hf = dict(
            hf.get("text_config") or {}, **{k: v for k, v in hf.items() if k != "text_config"}
        )
        model_type = hf.get("model_type")
        if model_type not in _FAMILY_DEFAULTS:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported; supported: {sorted(_FAMILY_DEFAULTS)}"
            )
        _refuse_unsupported(hf)
        family = _FAMILY_DEFAULTS[model_type]
        num_heads = int(hf["num_attention_heads"])
        num_kv_heads = int(hf.get("num_key_value_heads") or num_heads)
        hidden_size = int(hf["hidden_size"])
        head_dim = int(hf.get("head_dim") or hidden_size // num_heads)
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={num_heads} is not a multiple of "
                f"num_key_value_heads={num_kv_heads}"
            )
        num_layers = int(hf["num_hidden_layers"])
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(hf, head_dim),
            max_position=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=family.get("qkv_bias", False) or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=family.get("qk_norm", False),
            sliding_windows=_sliding_windows(hf, model_type, num_layers),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_as_ids(hf.get("eos_token_id")),
        )


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def _refuse_unsupported(hf: dict[str, Any]) -> None:
    """Options that change the math and that we do not implement: fail loudly, naming them."""
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only silu)")
    if int(hf.get("pretraining_tp", 1)) != 1:
        raise UnsupportedModelError("pretraining_tp != 1 is not supported")
    # quantization_config: tgix/models/prequant.py reads it (and refuses what it cannot read)


def _rope_from_hf(hf: dict[str, Any], head_dim: int) -> RopeConfig:
    """Merge transformers 4.x `rope_theta` + `rope_scaling` and 5.x `rope_parameters`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported; supported: {sorted(_ROPE_KEYS)}"
        )
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1.0 is not supported")
    if rope_type in ("llama3", "yarn"):  # transformers' fallbacks for the pretraining length
        params.setdefault(
            "original_max_position_embeddings",
            hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings"),
        )
        original = params["original_max_position_embeddings"]
        if rope_type == "yarn" and params.get("factor") is None and original:
            params["factor"] = hf["max_position_embeddings"] / original
    missing = sorted(k for k in _ROPE_KEYS[rope_type] if params.get(k) is None)
    if missing:
        raise UnsupportedModelError(f"rope type {rope_type!r} needs {missing}")
    known = _ROPE_KEYS[rope_type] | _ROPE_OPTIONAL | {"rope_type", "type", "rope_theta"}
    if rope_type != "yarn":
        known -= _ROPE_OPTIONAL
    unknown = set(params) - known - {"partial_rotary_factor"}
    if unknown:
        raise UnsupportedModelError(
            f"rope option(s) {sorted(unknown)} for {rope_type!r} not supported"
        )
    if head_dim % 2:
        raise UnsupportedModelError(f"head_dim={head_dim} must be even for rotary embeddings")
    opt = lambda key: None if params.get(key) is None else float(params[key])
    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=(
            None
            if params.get("original_max_position_embeddings") is None
            else int(params["original_max_position_embeddings"])
        ),
        attention_factor=opt("attention_factor"),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )


def _sliding_windows(
    hf: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    """Per-layer window. Mistral: every layer; Qwen2/3: `layer_types` or max_window_layers."""
    window = hf.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        window = None
    if not window:
        return (None,) * num_layers
    layer_types = hf.get("layer_types")
    if layer_types is None and model_type in ("qwen2", "qwen3"):
        first = int(hf.get("max_window_layers", num_layers))
        layer_types = [
            "sliding_attention" if i >= first else "full_attention" for i in range(num_layers)
        ]
    if layer_types is None:
        return (int(window),) * num_layers
    if len(layer_types) != num_layers:
        raise UnsupportedModelError(
            f"layer_types has {len(layer_types)} entries for {num_layers} layers"
        )
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


def yarn_attention_factor(rope: RopeConfig) -> float:
    """The cos/sin scale YaRN applies (transformers' `get_mscale` rule)."""
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)
