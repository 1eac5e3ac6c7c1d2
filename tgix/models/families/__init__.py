"""The model families: what each `model_type` changes in the shared decoder.

A family is one file here: its config switches (ModelConfig fields read from its
`config.json`), its rope and sliding-window rules, and its weight table (tgix/models/
weight_table.py rows: checkpoint tensor names -> parameter paths, one-to-many for fused
tensors, many-to-one for stacked experts). The decoder (tgix/models/decoder.py) and its
blocks read only ModelConfig, so adding a family is adding a file and naming it below.
"""

from __future__ import annotations

from tgix.models.families import gemma, llama, moe, phi3
from tgix.models.families.base import Family
from tgix.models.rope_config import UnsupportedModelError

__all__ = ["FAMILIES", "Family", "family_of"]

FAMILIES: dict[str, Family] = {
    model_type: family
    for family in (*llama.FAMILIES, *gemma.FAMILIES, *phi3.FAMILIES, *moe.FAMILIES)
    for model_type in family.model_types
}


def family_of(model_type: str | None) -> Family:
    """The family of a `model_type`; UnsupportedModelError naming the supported ones."""
    if model_type in REFUSED:
        raise UnsupportedModelError(f"model_type {model_type!r}: {REFUSED[model_type]}")
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}"
        )
    return FAMILIES[model_type]


# Checkpoints of a supported family that need what tgix does not serve, refused by name.
REFUSED = {
    "gemma3": "Gemma3ForConditionalGeneration carries a vision tower, which tgix does not "
    "serve; use a text-only Gemma 3 checkpoint (model_type gemma3_text)",
}
