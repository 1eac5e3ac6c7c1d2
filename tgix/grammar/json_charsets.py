"""Character sets (ranges of code points) and their JSON-text regexes: the raw characters as
a class, the ones JSON must escape (`"`, `\\`, control characters) as their canonical
escapes, UTF-16 surrogates left out. Also the ECMA-262 class escapes `\\d` `\\w` `\\s` and
line terminators (for `.`)."""

from __future__ import annotations

from tgix.grammar.regex_tree import escape

Ranges = list[tuple[int, int]]

MAX_CODE_POINT = 0x10FFFF
DIGIT: Ranges = [(0x30, 0x39)]
WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A)]
SPACE += [(0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
SPACE += [(0xFEFF, 0xFEFF)]
LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
CONTROL_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
_SHORT = {0x22: '\\\\"', 0x5C: r"\\\\", 8: r"\\b", 12: r"\\f", 10: r"\\n", 13: r"\\r", 9: r"\\t"}
_SPECIALS = [0x22, 0x5C, *range(0x20)]


def _normalize(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in _normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return out


def _subtract(ranges: Ranges, cut: Ranges) -> Ranges:
    return complement(complement(ranges) + cut)


def _class_char(cp: int) -> str:
    ch = chr(cp)
    return "\\" + ch if ch in "\\]^-[" else ch


def charset_regex(ranges: Ranges) -> str | None:
    """Regex for the JSON text of one character of the set: the raw characters as a class,
    the ones JSON must escape as their canonical escapes. None if the set is empty."""
    ranges = _normalize(ranges)
    parts = []
    raw = _subtract(ranges, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0xD800, 0xDFFF)])
    if len(raw) == 1 and raw[0][0] == raw[0][1]:
        parts.append(escape(chr(raw[0][0])))
    elif raw:
        big = sum(hi - lo + 1 for lo, hi in raw) > 0x10000
        if big:  # write large sets as a negated class (interegular's `anything_else`)
            rest = [(max(lo, 0x20), hi) for lo, hi in complement(raw) if hi >= 0x20]
            body = "".join(_class_range(lo, hi) for lo, hi in rest)
            parts.append(f'[^"\\\\\\x00-\\x1f{body}]')
        else:
            parts.append("[" + "".join(_class_range(lo, hi) for lo, hi in raw) + "]")
    members = [c for c in _SPECIALS if any(lo <= c <= hi for lo, hi in ranges)]
    if len(members) == len(_SPECIALS):
        parts.append(r'\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f])')
    else:
        parts.extend(_SHORT.get(c, f"\\\\u00{c:02x}") for c in members)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _class_range(lo: int, hi: int) -> str:
    """Class syntax for [lo, hi], leaving out UTF-16 surrogates (not characters in UTF-8)."""
    pieces = [(lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)]
    out = []
    for a, b in pieces:
        if a <= b:
            out.append(_class_char(a) if a == b else _class_char(a) + "-" + _class_char(b))
    return "".join(out)
