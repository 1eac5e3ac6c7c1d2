"""Vision-language checkpoints: the text decoder inside them, and their vision side.

A VLM's config.json nests the decoder's config under `text_config` and its tensors under a
prefix (Idefics3 / SmolVLM: `model.text_model.`, with `lm_head.weight` at the top); the
decoder loads as any text model through TextModelSource, and the vision tower and connector
load separately (tgix/models/vision/).
"""

from __future__ import annotations

import dataclasses

from tgix.models.checkpoint import CheckpointError

# model_type -> where the decoder's `model.*` tensors sit in the checkpoint
# (Qwen2.5-VL: `model.` as transformers 4.x saved it, `model.language_model.` from 4.52 on)
TEXT_PREFIXES = {
    "idefics3": ("model.text_model.",),
    "smolvlm": ("model.text_model.",),
    "qwen2_5_vl": ("model.language_model.", "model."),
}


@dataclasses.dataclass(frozen=True)
class VisionCheckpoint:
    """What a VLM checkpoint is: its model_type, the decoder's config dict and prefix."""

    model_type: str
    text_config: dict
    text_prefixes: tuple[str, ...]


def vision_checkpoint(hf_config: dict) -> VisionCheckpoint | None:
    """The VLM reading of a config.json, or None for a text-only model."""
    model_type = hf_config.get("model_type")
    if model_type not in TEXT_PREFIXES:
        return None
    text = dict(hf_config.get("text_config") or {})
    if not text:
        raise CheckpointError(f"{model_type} config.json has no text_config")
    text.setdefault("model_type", _TEXT_TYPES.get(model_type, "llama"))
    for key in ("tie_word_embeddings", "torch_dtype", "eos_token_id"):
        if key in hf_config and key not in text:
            text[key] = hf_config[key]
    if "rope_parameters" not in text and "rope_scaling" in hf_config:  # transformers 4.x
        text["rope_scaling"] = hf_config["rope_scaling"]
    return VisionCheckpoint(model_type, text, TEXT_PREFIXES[model_type])


_TEXT_TYPES = {"qwen2_5_vl": "qwen2_5_vl_text"}


class TextModelSource:
    """A TensorSource showing only a VLM's decoder, under the names a text model has:
    `<prefix>X` as `model.X` (the first of `prefixes` the checkpoint has), and
    `lm_head.weight` as it is; the vision tensors stay hidden."""

    def __init__(self, inner, prefixes: tuple[str, ...]):
        self.inner = inner
        self._names = {}
        names = inner.names()
        prefix = next((p for p in prefixes if f"{p}embed_tokens.weight" in names), prefixes[-1])
        for name in names:
            if name.startswith(prefix) and not name.startswith(("model.visual.", "visual.")):
                self._names["model." + name[len(prefix) :]] = name
            elif name == "lm_head.weight":
                self._names[name] = name

    def names(self) -> list[str]:
        return list(self._names)

    def read(self, name: str):
        return self.inner.read(self._names[name])

    def __getattr__(self, attr):  # layout() and the like of the wrapped source
        return getattr(self.inner, attr)


def load_vision(model_type: str, path, *, dtype):
    """The vision side (tower + connector) of a VLM checkpoint folder."""
    from tgix.models.vision.idefics3 import load_idefics3_vision

    if model_type in ("idefics3", "smolvlm"):
        return load_idefics3_vision(path, dtype=dtype)
    if model_type == "qwen2_5_vl":
        from tgix.models.vision.qwen2_5_vl import load_qwen25_vision

        return load_qwen25_vision(path, dtype=dtype)
    raise CheckpointError(f"no vision encoder for model_type {model_type!r}")
