"""fp8 KV cache scales from a checkpoint: per layer `self_attn.k_scale` and `v_scale` (or one
`kv_scale` for both), scalars, as TGI and vLLM read them; absent, 1.0.

They are taken out of the tensor source before the weights load (no parameter holds them)
and set on each layer's attention block as static floats (attention_block.PagedAttention.
kv_scales), which uses them only when the KV pages are fp8.
"""

from __future__ import annotations

import re

import numpy as np

from tgix.models.checkpoint import CheckpointError

_SCALE = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale)")


class WithoutKVScales:
    """A TensorSource minus its KV scale tensors, which `scales` holds per layer."""

    def __init__(self, inner):
        self.inner = inner
        self.scales: dict[int, tuple[float, float]] = {}
        found: dict[int, dict[str, float]] = {}
        for name in inner.names():
            match = _SCALE.fullmatch(name)
            if match:
                value = np.asarray(inner.read(name), np.float32)
                if value.size != 1 or not np.isfinite(value).all() or value.item() <= 0:
                    raise CheckpointError(f"{name} must be one positive scale, got {value}")
                found.setdefault(int(match.group(1)), {})[match.group(2)] = float(value.item())
        for layer, parts in found.items():
            both = parts.get("kv_scale", 1.0)
            self.scales[layer] = (parts.get("k_scale", both), parts.get("v_scale", both))
        self._names = [n for n in inner.names() if not _SCALE.fullmatch(n)]

    def names(self) -> list[str]:
        return self._names

    def read(self, name: str):
        return self.inner.read(name)

    def __getattr__(self, attr):  # layout(), keep_blocks, ... of the wrapped source
        return getattr(self.inner, attr)


def apply_kv_scales(model, scales: dict[int, tuple[float, float]]) -> None:
    """Set each layer's attention block's (k_scale, v_scale)."""
    for layer, pair in scales.items():
        model.layers[layer].self_attn.kv_scales = pair
