"""String schemas: `minLength` / `maxLength` (code points), `pattern` and `format`, each a
language over the JSON text between the quotes; several of them are intersected (`Both`).

Plain strings accept every JSON spelling (all escapes, `\\uXXXX` and surrogate pairs);
strings under a `pattern` or `format`, and every string in `canonical` mode, accept only the
canonical spelling of each character (what `json.dumps(..., ensure_ascii=False)` writes), so
that subtracting languages stays exact.

`maxLength` above `LENGTH_CAP` is generated as at most `LENGTH_CAP` code points (reported in the
notes): each allowed position costs a copy of the character automaton, and 32767-character
bounds are common in real schemas.
"""

from __future__ import annotations

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import (
    CANONICAL_UNIT,
    STRING_UNIT,
    Context,
    both,
    cat,
    prune_empty,
    repeat,
)
from tgix.grammar.json_formats import format_regex
from tgix.grammar.json_pattern import pattern_regex
from tgix.grammar.regex_tree import Node, Regex, literal

LENGTH_CAP = 256


def count_keyword(schema: dict, name: str) -> int | None:
    """A non-negative integer keyword (minLength, maxItems, ...), None when absent."""
    value = schema.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise GrammarError(f"JSON Schema keyword {name!r} must be a non-negative integer")
    if isinstance(value, float) and not value.is_integer():
        raise GrammarError(f"JSON Schema keyword {name!r} must be a non-negative integer")
    return int(value)


def as_tuple(value: object) -> tuple:
    """A keyword that merging may have turned into several values (e.g. two patterns)."""
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)


def string_node(schema: dict, ctx: Context, canonical: bool) -> Node:
    """The JSON text (quotes included) of the strings the schema's string keywords allow."""
    lo = count_keyword(schema, "minLength") or 0
    hi = count_keyword(schema, "maxLength")
    if hi is not None and hi > LENGTH_CAP and hi >= lo:
        capped = max(LENGTH_CAP, lo)
        if capped < hi:
            ctx.approximate(f"maxLength {hi} generated as at most {capped} characters")
            hi = capped
    parts: list[Node] = []
    for source in as_tuple(schema.get("pattern")):
        if not isinstance(source, str):
            raise GrammarError("JSON Schema keyword 'pattern' must be a string")
        parts.append(Regex(pattern_regex(source, CANONICAL_UNIT)))
    for name in as_tuple(schema.get("format")):
        if not isinstance(name, str):
            raise GrammarError("JSON Schema keyword 'format' must be a string")
        regex = format_regex(name)
        if regex is not None:
            ctx.approximations += 1  # a subset of what format checkers accept
            parts.append(Regex(regex))
    unit = CANONICAL_UNIT if canonical or parts else STRING_UNIT
    if lo or hi is not None or not parts:
        parts.append(repeat(Regex(unit), lo, hi) if (lo, hi) != (0, None) else Regex(unit + "*"))
    return cat(literal('"'), prune_empty(both(*parts)), literal('"'))


def key_node(ctx: Context) -> Node:
    """Any object key, canonically spelled (so declared names can be subtracted exactly)."""
    del ctx
    return cat(literal('"'), Regex(CANONICAL_UNIT + "*"), literal('"'))
