"""JSON numbers and integers as regexes, with exact `minimum` / `maximum` /
`exclusiveMinimum` / `exclusiveMaximum` and decimal `multipleOf`.

- Unbounded: the full JSON number grammar (`-?(0|[1-9]\\d*)(\\.\\d+)?([eE][+-]?\\d+)?`);
  integers are `-?(0|[1-9]\\d*)`: integer literals only (JSON Schema also counts `1.0`,
  which a model would extend with zeros until its token limit). Both unbounded in length.
- Bounds are exact digit-range regexes for integers and for decimals with any bound (the
  bounds are compared as decimals: `0.1` means the JSON text `0.1`, not the nearest double).
  A bounded number is written without an exponent (`1e2` is not generated): a documented
  subset, never a superset.
- `canonical`: one spelling per value (no `-0`, no exponent, no trailing zeros in the
  fraction); used where languages are subtracted (`oneOf`), so that a value cannot slip
  through under a second spelling.
- `multipleOf` k = a * 10^e with a dividing 10^j (j <= 3: 1, 2, 4, 5, 8, 10, 20, 25, 50, ...,
  0.01, 0.25, 2.5, ...) as a condition on the last digits; other divisors raise.
"""

from __future__ import annotations

from decimal import Decimal

from tgix.grammar.errors import GrammarError

INTEGER = r"-?(?:0|[1-9]\d*)"
NUMBER = r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?"
CANONICAL_INTEGER = r"(?:0|-?[1-9]\d*)"
CANONICAL_NUMBER = r"(?:(?:0|-?[1-9]\d*)(?:\.\d*[1-9])?|-0\.\d*[1-9])"


def _digit(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return r"\d" if (lo, hi) == (0, 9) else f"[{lo}-{hi}]"


def _alt(parts: list[str]) -> str | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of len(lo) == len(hi) between lo and hi (leading zeros are digits)."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    n = len(lo) - 1
    a, b = int(lo[0]), int(hi[0])
    parts = []
    start = a if set(lo[1:]) <= {"0"} else a + 1
    end = b if set(hi[1:]) <= {"9"} else b - 1
    if start > a:
        parts.append(lo[0] + _same_length(lo[1:], "9" * n))
    if start <= end:
        parts.append(_digit(start, end) + (rf"\d{{{n}}}" if n > 1 else r"\d" * n))
    if end < b:
        parts.append(hi[0] + _same_length("0" * n, hi[1:]))
    return _alt(parts)


def uint_range(lo: int, hi: int | None) -> str | None:
    """Canonical decimal texts (no leading zeros) of the integers in [lo, hi], lo >= 0."""
    if hi is not None and hi < lo:
        return None
    parts = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for length in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(top, 10**length - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    if hi is None:
        parts.append(rf"[1-9]\d{{{len(str(lo))},}}")
    return _alt(parts)


def integer_range(lo: int | None, hi: int | None) -> str | None:
    """Canonical integer texts in [lo, hi] (None = unbounded); None if the range is empty."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(uint_range(max(lo or 0, 0), hi))
    if lo is None or lo < 0:
        low_mag = 1 if hi is None or hi >= 0 else -hi
        neg = uint_range(low_mag, None if lo is None else -lo)
        parts.append(None if neg is None else "-" + neg)
    return _alt(parts)


def _split(value: Decimal) -> tuple[int, str]:
    """Integer part and canonical fraction digits (no trailing zeros) of value >= 0."""
    text = f"{value:f}"
    whole, _, frac = text.partition(".")
    return int(whole), frac.rstrip("0")


def _fraction(alpha: str, a_strict: bool, beta: str | None, b_strict: bool):
    """Digit strings D (the fraction after the point, possibly empty) with alpha < 0.D < beta
    (`<=` unless strict; alpha '' is 0; beta None is no upper bound). Returns (regex of the
    non-empty ones or None, whether the empty fraction qualifies)."""
    empty = alpha == "" and not a_strict and (beta is None or beta != "" or not b_strict)
    if alpha == "" and beta is None:
        return (r"\d+" if not a_strict else r"0*[1-9]\d*"), empty
    if alpha == "" and beta == "":
        return ("0+" if not (a_strict or b_strict) else None), empty
    a = int(alpha[0]) if alpha else 0
    b = 9 if beta is None else (int(beta[0]) if beta else 0)
    rest_a = alpha[1:]
    rest_b = None if beta is None else beta[1:]
    options = []
    if a == b and beta is not None:
        options.append((str(a), _fraction(rest_a, a_strict, rest_b, b_strict)))
    else:
        options.append((str(a), _fraction(rest_a, a_strict, None, False)))
        if b - a > 1 or (beta is None and b > a):
            hi = b if beta is None else b - 1
            options.append((_digit(a + 1, hi), (r"\d+", True)))
        if beta is not None:
            options.append((str(b), _fraction("", False, rest_b, b_strict)))
    parts = []
    for head, (tail, tail_empty) in options:
        if tail is None:
            if tail_empty:
                parts.append(head)
            continue
        parts.append(head + (f"(?:{tail})?" if tail_empty else tail))
    return _alt(parts), empty


def _with_fraction(whole: str | None, frac) -> str | None:
    tail, empty = frac
    if whole is None or (tail is None and not empty):
        return None
    if tail is None:
        return whole
    return whole + (rf"(?:\.{tail})?" if empty else rf"\.{tail}")


def _magnitude(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> str | None:
    """Texts `I(.F)?` (no sign, no exponent) of the decimals in the interval, lo >= 0."""
    a_int, alpha = _split(lo)
    if hi is None:
        return _alt(
            [
                _with_fraction(str(a_int), _fraction(alpha, lo_strict, None, False)),
                _with_fraction(uint_range(a_int + 1, None), (r"\d+", True)),
            ]
        )
    if hi < lo or (hi == lo and (lo_strict or hi_strict)):
        return None
    b_int, beta = _split(hi)
    if a_int == b_int:
        return _with_fraction(str(a_int), _fraction(alpha, lo_strict, beta, hi_strict))
    return _alt(
        [
            _with_fraction(str(a_int), _fraction(alpha, lo_strict, None, False)),
            _with_fraction(uint_range(a_int + 1, b_int - 1), (r"\d+", True)),
            _with_fraction(str(b_int), _fraction("", False, beta, hi_strict)),
        ]
    )


def number_range(
    lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool
) -> str | None:
    """JSON number texts (no exponent) of the values in the interval; None if empty. `-0`
    spellings are included exactly when 0 is in the interval."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_strict):
        if lo is None or lo < 0:
            parts.append(_magnitude(Decimal(0), False, hi, hi_strict))
        else:
            parts.append(_magnitude(lo, lo_strict, hi, hi_strict))
    if lo is None or lo < 0 or (lo == 0 and not lo_strict):
        if hi is None or hi > 0:
            m_lo, m_lo_strict = Decimal(0), False
        else:
            m_lo, m_lo_strict = -hi, hi_strict
        m_hi = None if lo is None else -lo
        neg = _magnitude(m_lo, m_lo_strict, m_hi, lo_strict)
        parts.append(None if neg is None else "-" + neg)
    return _alt(parts)


def integer_bounds(
    lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool
) -> tuple[int | None, int | None]:
    """The closed integer interval inside the given decimal interval."""
    ilo = ihi = None
    if lo is not None:
        ilo = int(lo.to_integral_value(rounding="ROUND_FLOOR"))
        if ilo < lo or (ilo == lo and lo_strict):
            ilo += 1
    if hi is not None:
        ihi = int(hi.to_integral_value(rounding="ROUND_CEILING"))
        if ihi > hi or (ihi == hi and hi_strict):
            ihi -= 1
    return ilo, ihi


def multiple_of(k: Decimal, integer: bool) -> str:
    """Texts (no exponent) of the numbers, or integers, that are multiples of k; raises for a
    k this cannot express."""
    if k <= 0:
        raise GrammarError(f"multipleOf must be positive, got {k}")
    _, digits, exp = k.normalize().as_tuple()
    a = int("".join(map(str, digits)))
    j = next((j for j in range(4) if 10**j % a == 0), None)
    if j is None:
        raise GrammarError(
            f"JSON Schema keyword 'multipleOf' with value {k} is not supported "
            "(only a divisor of 1000 times a power of ten)"
        )
    # x = k * n  <=>  D = the digits of x * 10^-exp (integer part followed by the fraction
    # padded to m digits) ends with a multiple of a written in j digits, then `exp` zeros.
    m = max(-exp, 0)
    parts = []
    for r in range(0, 10**j, a):
        tail = (f"{r:0{j}d}" if j else "") + "0" * max(exp, 0)
        if len(tail) >= m:
            whole_tail, frac = tail[: len(tail) - m], list(tail[len(tail) - m :])
        else:
            whole_tail, frac = "", [r"\d"] * (m - len(tail)) + list(tail)
        zeros_ok = [all(d in ("0", r"\d") for d in frac[i:]) for i in range(m + 1)]
        if integer:
            if not zeros_ok[0]:
                continue
            fraction = ""
        elif m == 0:
            fraction = r"(?:\.0+)?"
        else:
            rest = "0*"
            for i in range(m - 1, 0, -1):
                rest = f"(?:{frac[i]}{rest})?" if zeros_ok[i] else frac[i] + rest
            fraction = rf"\.{frac[0]}{rest}"
            fraction = f"(?:{fraction})?" if zeros_ok[0] else fraction
        short = whole_tail.lstrip("0") or "0"
        whole = rf"(?:{short}|[1-9]\d*{whole_tail})" if whole_tail else r"(?:0|[1-9]\d*)"
        parts.append(whole + fraction)
    return "-?" + _alt(parts)


def canonical_number_text(value: int | float) -> str:
    """The canonical spelling of a number: plain decimal, no exponent, no trailing zeros."""
    d = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    if d == 0:
        return "0"
    text = format(d.normalize(), "f")
    return text
