"""GGUF files (llama.cpp's format): config, tensors by Hugging Face name, dequantized on read
or (`keep_blocks`) linear weights kept in their blocks (tgix/models/gguf_blocks.py).

The `gguf` package parses the file (memory-mapped) and dequantizes each tensor to float32.
llama.cpp's converter permutes the rows of Llama q/k projections to its interleaved rope
layout; we undo that so the weights fit transformers' rotate-half rope.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from tgix.models.checkpoint import CheckpointError
from tgix.models.config import UnsupportedModelError
from tgix.models.gguf_blocks import layout_of, read_blocks
from tgix.models.quant_group import GroupedWeight, GroupLayout

_ARCHES = ("llama", "qwen2", "qwen3")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# the linear weights (kept in their blocks with keep_blocks): those mapped to *_proj.weight
_LINEAR = tuple(g for g, hf in _LAYER_NAMES.items() if hf.endswith("_proj.weight"))


def hf_name(gguf_name: str) -> str:
    """Map a GGUF tensor name to its transformers name; raises CheckpointError if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no tgix mapping")


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, rows (pair, half) -> (half, pair)."""
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


class GGUFSource:
    """A .gguf file as a TensorSource, plus the transformers-style config its metadata implies."""

    def __init__(self, path: str | Path, *, keep_blocks: bool = False):
        from gguf import GGUFReader

        self.path = Path(path)
        self.keep_blocks = keep_blocks  # linear weights of gguf_blocks.KEPT_TYPES stay blocks
        try:
            self.reader = GGUFReader(self.path)
        except (ValueError, OSError) as e:
            raise CheckpointError(f"{self.path.name}: not a readable GGUF file ({e})") from e
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCHES:
            raise UnsupportedModelError(
                f"GGUF architecture {self.arch!r} is not supported; supported: {list(_ARCHES)}"
            )
        self._tensors = {}
        for tensor in self.reader.tensors:
            if tensor.name == "rope_freqs.weight":
                raise UnsupportedModelError("GGUF rope_freqs (llama3 rope factors) not supported")
            self._tensors[hf_name(tensor.name)] = tensor

    def field(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def hf_config(self) -> dict[str, Any]:
        """The config.json transformers would write for this file (fed to ModelConfig.from_hf)."""
        a = self.arch
        num_heads = int(self.field(f"{a}.attention.head_count"))
        hidden = int(self.field(f"{a}.embedding_length"))
        config = {
            "model_type": a,
            "num_hidden_layers": int(self.field(f"{a}.block_count")),
            "max_position_embeddings": int(self.field(f"{a}.context_length", 2048)),
            "hidden_size": hidden,
            "intermediate_size": int(self.field(f"{a}.feed_forward_length")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(self.field(f"{a}.attention.head_count_kv", num_heads)),
            "head_dim": int(self.field(f"{a}.attention.key_length", hidden // num_heads)),
            "rope_theta": float(self.field(f"{a}.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(self.field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "vocab_size": int(
                self.field(f"{a}.vocab_size")
                or len(self.reader.fields["tokenizer.ggml.tokens"].data)
            ),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "attention_bias": "model.layers.0.self_attn.o_proj.bias" in self._tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.field("tokenizer.ggml.eos_token_id"),
        }
        scaling = self.field(f"{a}.rope.scaling.type")
        if scaling and scaling != "none":
            config["rope_scaling"] = {
                "rope_type": scaling,
                "factor": float(self.field(f"{a}.rope.scaling.factor")),
                "original_max_position_embeddings": self.field(
                    f"{a}.rope.scaling.original_context_length"
                ),
            }
        if self.field(f"{a}.attention.sliding_window"):
            raise UnsupportedModelError("GGUF sliding-window models are not supported yet")
        return config

    def names(self) -> list[str]:
        return list(self._tensors)

    def layout(self, name: str) -> GroupLayout | None:
        """The GroupLayout tensor `name` reads into (None: it reads as float)."""
        tensor = self._tensors[name]
        if not self.keep_blocks or not tensor.name.endswith(_LINEAR):
            return None
        return layout_of(tensor.tensor_type.name)

    @property
    def quantized_linear(self) -> bool:
        """Whether any linear weight is stored in a kept block type."""
        kept = lambda t: t.name.endswith(_LINEAR) and layout_of(t.tensor_type.name) is not None
        return any(kept(t) for t in self._tensors.values())

    def read(self, name: str) -> np.ndarray | GroupedWeight:
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        if self.layout(name) is not None:
            rows, cols = reversed(tensor.shape.tolist())
            weight = read_blocks(np.asarray(tensor.data), tensor.tensor_type.name, int(cols))
            return weight.take_rows(self._rope_rows(name, np.arange(int(rows))))
        w = dequantize(tensor.data, tensor.tensor_type)
        w = np.asarray(w, dtype=np.float32).reshape(tuple(reversed(tensor.shape.tolist())))
        return self._rope_rows(name, w)

    def _rope_rows(self, name: str, w: np.ndarray) -> np.ndarray:
        """Llama q/k rows (or their indices) back in transformers' order."""
        if self.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            return unpermute_rope_rows(w, int(self.field("llama.attention.head_count")))
        if self.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            return unpermute_rope_rows(w, int(self.field("llama.attention.head_count_kv")))
        return w
