"""Test support: a tiny ExLlamaV2 (exl2) checkpoint written from a float one, with a float twin.

Each linear layer and the LM head is quantized in ExLlamaV2's layout (tgix/models/exl2.py):
W^T's rows sorted by a random permutation (`q_invperm`), split into groups whose bit widths
cycle through 2, 3, 4, 5, 6, 8 (groups of 32 rows, 64 on the LM head, in descending width
there as ExLlamaV2 orders them), a 4-bit scale code per group and column under the group's
float16 maximum, and N padded to a multiple of 32 with zero codes (scale nibbles 15, what
ExLlamaV2's pack_rows_4 leaves there). Beyond what ExLlamaV2 writes, odd layers end in 16 rows
of 6 bits and 16 of 3 bits (the last ending mid-word), which the reader also takes. The codes
are packed as ExLlamaV2's pack_columns kernel does (blocks of 32 rows, each code shifted into
`bits` words), independently of tgix's reader, and the float twin holds the definition's
dequantization computed from the codes before packing.
"""

from __future__ import annotations

import pathlib

import numpy as np

from tgix.testing_quant import float_tensors, linear_layers, write_checkpoint

CYCLE = (3, 5, 4, 8, 2, 6)  # every width ExLlamaV2 writes


def _schedule(k: int, layer: int, head: bool) -> list[tuple[int, int]]:
    """(bits, rows) per group over K inputs."""
    if head:
        return [(b, 64) for b in sorted(CYCLE, reverse=True)[: k // 64]]
    sizes = [32] * (k // 32)
    if layer % 2 and sizes:
        sizes[-1:] = [16, 16]
    bits = [CYCLE[(layer + i) % len(CYCLE)] for i in range(len(sizes))]
    if layer % 2:
        bits[-2:] = [6, 3]  # 16 rows of 6 bits fill 3 words; 16 of 3 bits end mid-word
    return list(zip(bits, sizes, strict=True))


def _wshift(x: np.ndarray, j: int) -> np.ndarray:
    if j <= -32 or j >= 32:
        return np.zeros_like(x)
    return x >> np.uint32(-j) if j < 0 else x << np.uint32(j)


def _pack_columns(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [rows, N] -> int32 words [ceil(rows * bits / 32), N], 32 rows a block as
    ExLlamaV2's pack_columns (a last partial block padded with zero codes)."""
    rows, n = codes.shape
    padded = np.zeros((-(-rows // 32) * 32, n), np.uint32)
    padded[:rows] = codes
    words = []
    for block in range(0, len(padded), 32):
        for j in range(bits):
            word = np.zeros(n, np.uint32)
            for i in range(32):
                word |= _wshift(padded[block + i], i * bits - 32 * j)
            words.append(word)
    return np.stack(words)[: -(-rows * bits // 32)].view(np.int32)


def _quantize_group(w: np.ndarray, bits: int):
    """w [rows, N] -> (codes [rows, N], scale codes [N] 0..15, maximum float16, scale [N])."""
    qzero = 2 ** (bits - 1)
    base = np.maximum(np.abs(w).max(0) / max(qzero - 1, 1), 1e-4)
    maximum = np.float16(base.max() * 1.01)
    step = maximum / np.float16(256)
    codes = np.clip(np.ceil(np.sqrt(base / np.float32(step))) - 1, 0, 15).astype(np.int32)
    scale = (((codes + 1) ** 2).astype(np.float16) * step).astype(np.float32)
    q = np.clip(np.rint(w / scale) + qzero, 0, 2**bits - 1).astype(np.uint32)
    return q, codes, maximum, scale


def _exl2_layer(w: np.ndarray, layer: int, rng, head: bool) -> tuple[dict, np.ndarray]:
    """w [N, K] -> (the layer's exl2 tensors, its dequantization [N, K])."""
    n, k = w.shape
    perm = rng.permutation(k)
    rows_sorted = w.T[perm]  # stored row j is input perm[j]
    pad = -n % 32
    q_weight, q_groups, scale_codes, maxima, deq = [], [], [], [], np.empty((k, n), np.float32)
    row = q_row = 0
    for bits, rows in _schedule(k, layer, head):
        q, codes, maximum, scale = _quantize_group(rows_sorted[row : row + rows], bits)
        deq[row : row + rows] = (q.astype(np.float32) - 2 ** (bits - 1)) * scale
        q = np.pad(q, ((0, 0), (0, pad)), constant_values=2 ** (bits - 1))
        words = _pack_columns(q, bits)
        q_weight.append(words)
        q_groups += [bits, q_row]
        scale_codes.append(np.pad(codes, (0, pad), constant_values=15))
        maxima.append(maximum)
        row, q_row = row + rows, q_row + len(words)
    nibbles = np.stack(scale_codes).astype(np.uint32).reshape(len(maxima), -1, 8)
    q_scale = np.bitwise_or.reduce(nibbles << (np.arange(8, dtype=np.uint32) * 4), axis=-1)
    weight = np.empty_like(deq)
    weight[perm] = deq
    tensors = {
        "q_weight": np.concatenate(q_weight),
        "q_groups": np.array(q_groups, np.int16),
        "q_scale": q_scale.view(np.int32),
        "q_scale_max": np.array(maxima, np.float16),
        "q_invperm": np.argsort(perm).astype(np.int32),
    }
    return tensors, np.ascontiguousarray(weight.T)


def write_exl2_checkpoint(base, path, *, reference=None, seed: int = 0) -> pathlib.Path:
    """An exl2 checkpoint of the float checkpoint `base` (its decoder's input widths multiples
    of 32, the LM head's of 64), and at `reference` the float twin holding the exl2
    definition's weights."""
    tensors = float_tensors(base)
    out, ref = dict(tensors), dict(tensors)
    rng = np.random.default_rng(seed)
    layers = linear_layers(tensors, ()) + ["lm_head"] * ("lm_head.weight" in tensors)
    for index, layer in enumerate(layers):
        w = out.pop(f"{layer}.weight")
        parts, ref[f"{layer}.weight"] = _exl2_layer(w, index, rng, head=layer == "lm_head")
        out.update({f"{layer}.{part}": value for part, value in parts.items()})
    qc = {"quant_method": "exl2", "version": "0.2.8", "bits": 4.0, "head_bits": 6}
    return write_checkpoint(base, path, reference, out, ref, qc)
