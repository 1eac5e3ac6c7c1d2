"""ExLlamaV2 (exl2) linear layers -> quant_group.GroupedWeight, read as ExLlamaV2 stores them.

An exl2 layer quantizes W^T [K, N] (inputs as rows) after sorting its rows by importance
(`q_invperm` [K]: the stored order's inverse) into groups of rows, each with its own bit width
(2, 3, 4, 5, 6 or 8) and row count; the tensors are

  q_weight    int32 [sum of each group's b * rows / 32, N]: each group's codes, every column
              a little-endian bit stream down the group's rows (ExLlamaV2's pack_columns:
              32 rows in b words, 16 rows in one word at 2 bits, ...)
  q_groups    int16 [2 * groups]: (bits, first q_weight row) per group
  q_scale     int32 [groups, N / 8]: a 4-bit scale code s per group and column, 8 columns a
              word, low nibble first
  q_scale_max float16 [groups]
  q_invperm   int32 [K] (or q_perm, its inverse)

and a stored row k of group g dequantizes, for column n, to

  W^T[perm[k], n] = (q - 2^(b_g - 1)) * fp16((s + 1)^2 * q_scale_max[g] / 256)

the scale rounded to float16 as ExLlamaV2's kernels hold it (its `make_q_matrix` divides
q_scale_max by 256 and `dq_scale` multiplies in half precision). The product of a code of at
most 8 bits and a float16 scale is exact in float32, so the float form is exact; ExLlamaV2's
half-precision kernels round it once more. Codes keep 1 byte each in the kept form (bit widths
vary by group), with groups of G = gcd(rows of every group) inputs. ExLlamaV2 pads N up to a
multiple of 32 with zero codes; `out_features` (the LM head's: the vocabulary) cuts them off.
Checkpoints from before ExLlamaV2 wrote a quantization_config (v0.0.16) are recognised by
their `q_invperm` tensors (`looks_like_exl2`).
"""

from __future__ import annotations

import math

import numpy as np

from tgix.models.checkpoint import CheckpointError
from tgix.models.quant_group import GroupedWeight, GroupLayout, unpack_words

BITS = (2, 3, 4, 5, 6, 8)


def looks_like_exl2(names) -> bool:
    """Tensor names of an exl2 checkpoint (one without a quantization_config)."""
    return any(name.endswith(".q_invperm") for name in names)


def _pairs(q_groups) -> np.ndarray:
    """[groups, 2] (bits, first q_weight row); ExLlamaV2 reads the int16 tensor unsigned."""
    return np.asarray(q_groups).astype(np.int16).view(np.uint16).astype(np.int64).reshape(-1, 2)


def group_rows(q_groups, q_rows: int, num_inputs: int | None) -> list[tuple[int, int, int]]:
    """(bits, first q_weight row, inputs) per group. A group's inputs fill its words exactly,
    but the last group's, which may end mid-word: it takes the inputs that are left of
    `num_inputs` (K, the permutation's length; None without one: it fills its words too)."""
    pairs = _pairs(q_groups)
    out, taken = [], 0
    for i, (bits, start) in enumerate(pairs.tolist()):
        if bits not in BITS:
            raise CheckpointError(f"exl2 group of {bits} bits (ExLlamaV2 writes {BITS})")
        last = i + 1 == len(pairs)
        end = q_rows if last else pairs[i + 1, 1]
        rows = (end - start) * 32 // bits
        if last and num_inputs is not None:
            rows = num_inputs - taken
        if rows <= 0 or rows * bits > (end - start) * 32:
            raise CheckpointError(f"exl2 group {i}: {rows} inputs in {end - start} words")
        out.append((bits, start, rows))
        taken += rows
    if num_inputs is not None and taken != num_inputs:
        raise CheckpointError(f"exl2 groups hold {taken} inputs, q_invperm {num_inputs}")
    return out


def _column_codes(words: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """words [W, N] (one group's) -> codes [rows, N]: code r at bits [r * b, r * b + b) of
    each column's stream, which may cross from one word into the next."""
    w = words.astype(np.uint32).astype(np.uint64)
    w = np.concatenate([w, np.zeros((1, w.shape[1]), np.uint64)])  # the word after the last
    start = np.arange(rows, dtype=np.int64) * bits
    word, shift = start // 32, (start % 32).astype(np.uint64)
    pair = w[word] | (w[word + 1] << np.uint64(32))  # [rows, N] 64 bits from the code's word
    return ((pair >> shift[:, None]) & np.uint64((1 << bits) - 1)).astype(np.uint8)


def _scales(q_scale: np.ndarray, q_scale_max: np.ndarray, n: int) -> np.ndarray:
    """[groups, N] float32 holding float16 values: fp16((s + 1)^2 * max / 256)."""
    codes = unpack_words(q_scale, 4, 1)[:, :n]  # 8 columns a word, low nibble first
    square = ((codes.astype(np.int32) + 1) ** 2).astype(np.float16)
    per_group = (np.asarray(q_scale_max).astype(np.float16) / np.float16(256))[:, None]
    return (square * per_group).astype(np.float32)  # float16 product, rounded once


def _perm(q_invperm, q_perm) -> np.ndarray | None:
    """GroupedWeight's perm (the stored order's inputs) from either stored tensor."""
    if q_invperm is not None:
        return np.argsort(np.asarray(q_invperm), kind="stable").astype(np.int32)
    return None if q_perm is None else np.asarray(q_perm).astype(np.int32)


def read_exl2(
    q_weight, q_groups, q_scale, q_scale_max, q_invperm=None, q_perm=None, out_features=None
):
    """A layer's tensors -> GroupedWeight [N, K]: codes in the stored (sorted) input order,
    perm the stored order's inputs (GroupedWeight's W[n, perm[j]]); N cut to `out_features`
    when ExLlamaV2 padded it (the padding must be zero codes)."""
    q_weight = np.ascontiguousarray(q_weight).view(np.uint32)
    perm = _perm(q_invperm, q_perm)
    groups = group_rows(q_groups, q_weight.shape[0], None if perm is None else len(perm))
    n, k = q_weight.shape[1], sum(rows for _, _, rows in groups)
    scales = _scales(q_scale, q_scale_max, n)
    g = math.gcd(*(rows for _, _, rows in groups))
    codes = np.empty((k, n), np.uint8)
    scale, zero = np.empty((k // g, n), np.float32), np.empty((k // g, n), np.float32)
    row = 0
    for index, (bits, start, rows) in enumerate(groups):
        words = q_weight[start : start + -(-rows * bits // 32)]
        codes[row : row + rows] = _column_codes(words, bits, rows)
        scale[row // g : (row + rows) // g] = scales[index]
        zero[row // g : (row + rows) // g] = 2 ** (bits - 1)
        row += rows
    if perm is not None and np.array_equal(perm, np.arange(k)):
        perm = None
    if out_features is not None and out_features < n:
        padding_zero = np.repeat(zero[:, out_features:], g, axis=0)  # [K, N - out_features]
        if np.any(codes[:, out_features:] != padding_zero):
            raise CheckpointError(f"exl2 columns {out_features}..{n} are not zero padding")
        codes, scale, zero = (a[:, :out_features] for a in (codes, scale, zero))
    codes, scale, zero = (np.ascontiguousarray(a.T) for a in (codes, scale, zero))
    return GroupedWeight(codes, scale, 8, zero=zero, perm=perm)


def exl2_layout(q_weight_rows: int, q_groups, q_invperm=None, q_perm=None) -> GroupLayout:
    """The kept form's layout without unpacking: 8-bit codes, groups of gcd(rows) inputs."""
    perm = _perm(q_invperm, q_perm)
    groups = group_rows(q_groups, q_weight_rows, None if perm is None else len(perm))
    g = math.gcd(*(rows for _, _, rows in groups))
    permuted = perm is not None and not np.array_equal(perm, np.arange(len(perm)))
    return GroupLayout(8, g, zero=True, offset=False, perm=permuted)
