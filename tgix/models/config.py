"""ModelConfig: one normalised record of a Hugging Face `config.json`.

Every other module reads these fields and never looks at a raw `config.json`. The fields
every decoder shares are read here; what a family changes (its switches, its rope, its MoE
settings) is read by its file in tgix/models/families/.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tgix.models.rope_config import (
    RopeConfig,
    UnsupportedModelError,
    merged_rope_params,
    yarn_attention_factor,
)

__all__ = ["ModelConfig", "RopeConfig", "UnsupportedModelError", "yarn_attention_factor"]

# hidden_act / hidden_activation -> the MLP activation tgix computes
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Normalised decoder config. Shape letters: V D F N K H L E (see tgix/models/layers.py)."""

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
    local_rope: RopeConfig | None = None  # Gemma 3: the sliding layers' rope (None: `rope`)
    rotary_dim: int | None = None  # partial rotary (Phi-4-mini): the first dims; None = H
    # Qwen2.5-VL's M-RoPE: the H/2 frequency slots split over (time, height, width) position
    # rows, in this many slots each; None = one position per token
    mrope_section: tuple[int, ...] | None = None
    max_position: int = 2048  # max_position_embeddings
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2, or Llama's attention_bias (also sets o_proj bias there)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over H on q and k before rope
    sliding_windows: tuple[int | None, ...] = ()  # per layer; None = full attention
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_tanh"
    norm_plus_one: bool = False  # Gemma: every RMSNorm scales by (1 + weight)
    sandwich_norms: bool = False  # Gemma 2/3: norms after attention and MLP too (4 a layer)
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(D)
    attn_scale: float | None = None  # scores scale; None = H^-0.5 (Gemma: query_pre_attn_scalar)
    attn_softcap: float | None = None  # Gemma 2: scores = cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: the same on the logits
    num_experts: int = 0  # E (MoE layers; 0 = dense)
    experts_per_token: int = 0  # top-k experts per token
    expert_size: int = 0  # one expert's MLP width
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities (Mixtral: always)
    moe_layers: tuple[bool, ...] = ()  # per layer: sparse MoE block (else the dense MLP)
    shared_expert_size: int = 0  # Qwen2-MoE: a gated shared expert beside the routed ones
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def group_size(self) -> int:
        """G = N // K query heads share each KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf(json.loads(Path(path).read_text()))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict; raises UnsupportedModelError."""
        from tgix.models.families import family_of

        family = family_of(hf.get("model_type"))
        family.refuse(hf)
        hf = dict(
            hf.get("text_config") or {}, **{k: v for k, v in hf.items() if k != "text_config"}
        )
        if int(hf.get("pretraining_tp", 1)) != 1:
            raise UnsupportedModelError("pretraining_tp != 1 is not supported")
        # quantization_config: tgix/models/prequant.py reads it (and refuses what it cannot)
        act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
        if act not in _ACTIVATIONS or _ACTIVATIONS[act] not in family.activations:
            raise UnsupportedModelError(
                f"hidden_act {act!r} is not supported for {hf['model_type']} "
                f"(only {', '.join(family.activations)})"
            )
        num_heads = int(hf["num_attention_heads"])
        num_kv_heads = int(hf.get("num_key_value_heads") or num_heads)
        hidden_size = int(hf["hidden_size"])
        head_dim = int(hf.get("head_dim") or hidden_size // num_heads)
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={num_heads} is not a multiple of "
                f"num_key_value_heads={num_kv_heads}"
            )
        rotary_dim = _rotary_dim(hf, head_dim, family.partial_rotary)
        num_layers = int(hf["num_hidden_layers"])
        attention_bias = bool(hf.get("attention_bias", False))
        fields = dict(
            model_type=hf["model_type"],
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rotary_dim=None if rotary_dim == head_dim else rotary_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            sliding_windows=family.sliding_windows(hf, num_layers),
            hidden_act=_ACTIVATIONS[act],
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_as_ids(hf.get("eos_token_id")),
        )
        fields["rope"], fields["local_rope"] = family.rope(hf, rotary_dim)
        fields.update(family.switches(hf))
        return cls(**fields)


def _as_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list | tuple) else [value]))


def _rotary_dim(hf: dict[str, Any], head_dim: int, partial_allowed: bool) -> int:
    """head_dim * partial_rotary_factor (the factor may sit in the rope parameters)."""
    params = merged_rope_params(hf)
    factor = hf.get("partial_rotary_factor", 1.0)
    if not any(isinstance(v, dict) for v in params.values()):  # not per layer type (Gemma 3)
        factor = params.get("partial_rotary_factor", factor)
    factor = float(factor)
    if factor != 1.0 and not partial_allowed:
        raise UnsupportedModelError(
            f"partial_rotary_factor != 1.0 is not supported for {hf['model_type']}"
        )
    return int(head_dim * factor)
