"""GGUF quantized blocks kept quantized: Q8_0, Q4_0, Q4_1 and Q4_K tensors read straight into
quant_group.GroupedWeight (groups of 32 inputs), bit-equal to `gguf.quants.dequantize`.

`gguf` hands a quantized tensor as uint8 [rows, bytes per row], rows independent, so a row
permutation (llama.cpp's q/k order) applies to blocks as is. Per block of 32 weights (Q4_K: a
super-block of 256 = 8 sub-blocks of 32), as the `gguf` package dequantizes them in float32:

  Q8_0  34 bytes: fp16 d, 32 int8 q              d * q            codes q + 128, zero 128
  Q4_0  18 bytes: fp16 d, 16 bytes of nibbles    d * (q - 8)      zero 8
  Q4_1  20 bytes: fp16 d, fp16 m, 16 bytes       d * q + m        offset m
  Q4_K  144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins (sc, mn), 128 bytes
        of nibbles (each 32 bytes: low nibbles one sub-block, high nibbles the next)
                                                 (d * sc) * q - dmin * mn   offset -(dmin mn)
Nibbles of Q4_0/Q4_1: the low nibbles are elements 0-15 of the block, the high ones 16-31.
Other types (Q5_*, Q6_K, ...) are not kept: they load dequantized to float, as before.
"""

from __future__ import annotations

import numpy as np

from tgix.models.quant_group import GroupedWeight, GroupLayout

KEPT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K")
GROUP = 32


def layout_of(type_name: str) -> GroupLayout | None:
    """The GroupLayout a kept tensor of this GGML type loads into (None: not kept)."""
    if type_name not in KEPT_TYPES:
        return None
    bits = 8 if type_name == "Q8_0" else 4
    offset = type_name in ("Q4_1", "Q4_K")
    return GroupLayout(bits, GROUP, zero=not offset, offset=offset, perm=False)


def _f16(raw: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float32 (little-endian fp16)."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """[..., 16 bytes] -> [..., 32] codes: the low nibbles first, then the high ones."""
    return np.concatenate([raw & 15, raw >> 4], axis=-1)


def read_blocks(data: np.ndarray, type_name: str, cols: int) -> GroupedWeight:
    """A tensor's blocks (uint8 [rows, bytes per row]) -> GroupedWeight [rows, cols]."""
    rows = data.shape[0]
    if type_name == "Q4_K":
        return _q4_k(data.reshape(rows, cols // 256, 144), rows, cols)
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[type_name]
    blocks = data.reshape(rows, cols // GROUP, size)
    d = _f16(blocks[..., 0:2])  # [rows, groups]
    if type_name == "Q8_0":
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        zero = np.full(d.shape, 128.0, np.float32)
        return GroupedWeight(q.reshape(rows, cols), d, 8, zero=zero)
    if type_name == "Q4_0":
        q = _nibbles(blocks[..., 2:])
        zero = np.full(d.shape, 8.0, np.float32)
        return GroupedWeight(q.reshape(rows, cols), d, 4, zero=zero)
    m = _f16(blocks[..., 2:4])
    return GroupedWeight(_nibbles(blocks[..., 4:]).reshape(rows, cols), d, 4, offset=m)


def _q4_k(blocks: np.ndarray, rows: int, cols: int) -> GroupedWeight:
    """Q4_K super-blocks [rows, cols / 256, 144] -> groups of 32 (8 per super-block)."""
    from gguf.quants import Q4_K  # its unpacking of the 6-bit scales and mins

    supers = blocks.reshape(-1, 144)
    d, dmin = _f16(supers[:, 0:2]), _f16(supers[:, 2:4])  # [B]
    sc, mn = Q4_K.get_scale_min(supers[:, 4:16])  # [B, 8] each
    scale = d[:, None] * sc.astype(np.float32)
    offset = -(dmin[:, None] * mn.astype(np.float32))
    qs = supers[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 32 bytes: sub-blocks 2j, 2j + 1
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 256)
    groups = cols // GROUP
    return GroupedWeight(
        q.reshape(rows, cols), scale.reshape(rows, groups), 4,
        offset=offset.reshape(rows, groups),
    )  # fmt: skip
