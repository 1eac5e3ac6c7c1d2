"""Code point ranges as UTF-8 byte-range sequences, so a character-level regex becomes a
byte-level automaton that accepts exactly the valid UTF-8 encodings of its characters: no
overlong forms, no surrogates (U+D800..U+DFFF), no stray continuation bytes. A negated class
or `.` therefore never lets a model emit undecodable text, however the tokenizer splits
characters across tokens."""

from __future__ import annotations

from collections.abc import Iterable

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LENGTH_BOUNDS = (0x7F, 0x7FF, 0xFFFF)  # last code point encoded in 1, 2, 3 bytes

ByteRanges = tuple[tuple[int, int], ...]  # one (lo, hi) byte range per position


def ranges_of(code_points: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted code points merged into inclusive (lo, hi) ranges."""
    out: list[tuple[int, int]] = []
    for cp in sorted(set(code_points)):
        if out and out[-1][1] + 1 == cp:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every Unicode scalar value not in `ranges` (sorted, disjoint), surrogates excluded."""
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


def byte_sequences(lo: int, hi: int) -> list[ByteRanges]:
    """UTF-8 encodings of code points lo..hi as byte-range sequences: the strings matched by
    the concatenation of each sequence's ranges are exactly those encodings.

    A range is split at encoding-length boundaries and around surrogates, then wherever the
    low bytes of its ends are not the full continuation range 80..BF, until each piece has
    one lead range followed by ranges that vary independently."""
    out: list[ByteRanges] = []
    todo = [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        if lo > hi:
            continue
        s_lo, s_hi = _SURROGATES
        if lo <= s_hi and hi >= s_lo:
            todo += [(lo, s_lo - 1), (s_hi + 1, hi)]
            continue
        split = next((b for b in _LENGTH_BOUNDS if lo <= b < hi), None)
        if split is not None:
            todo += [(lo, split), (split + 1, hi)]
            continue
        if hi <= 0x7F:
            out.append(((lo, hi),))
            continue
        pieces = _split_continuations(lo, hi)
        if pieces:
            todo += pieces
            continue
        a, b = chr(lo).encode(), chr(hi).encode()
        out.append(tuple(zip(a, b, strict=True)))
    return out


def _split_continuations(lo: int, hi: int) -> list[tuple[int, int]]:
    """[] when lo..hi already encodes as independent byte ranges, else two sub-ranges."""
    for i in range(1, len(chr(lo).encode())):
        low_bits = (1 << (6 * i)) - 1
        if lo & ~low_bits != hi & ~low_bits:
            if lo & low_bits:
                return [(lo, lo | low_bits), ((lo | low_bits) + 1, hi)]
            if hi & low_bits != low_bits:
                return [(lo, (hi & ~low_bits) - 1), (hi & ~low_bits, hi)]
    return []
