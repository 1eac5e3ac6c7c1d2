"""Object schemas: `properties`, `required`, `additionalProperties`, `patternProperties`,
`minProperties` / `maxProperties`.

Layout of a generated object: the declared properties in schema order (then names that are
required but not declared, in `required` order), each present or absent as the schema
allows, then any number of additional members. Additional names are canonical JSON strings
minus the declared names (`Minus`), so no declared key can reappear as an extra one; a name
matching a `patternProperties` pattern gets that pattern's schema (names matching two
patterns are not generated when there are several patterns: a documented subset).
`additionalProperties` absent means any value (JSON Schema), or no extra members when the
`strict` option is set. `propertyNames` restricts the extra names (intersection) and drops
declared names it rejects.

Optional properties are chained left to right: P_k, "a non-empty in-order selection of the
first k members that holds every required one", is P_{k-1} followed by an optional
`, member_k`, or member_k alone while nothing required came before. Each member appears once
in the tree, so n optional properties cost O(n), not the O(n^2) of "which one is first".
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import (
    CANONICAL_UNIT,
    NEVER,
    Context,
    both,
    cat,
    json_string_text,
    minus,
    optional,
    prune_empty,
    repeat,
    union,
)
from tgix.grammar.json_pattern import pattern_regex
from tgix.grammar.json_strings import count_keyword
from tgix.grammar.regex_tree import Node, Regex, literal

Compile = Callable[[object], Node]

KEY = cat(literal('"'), Regex(CANONICAL_UNIT + "*"), literal('"'))


def object_node(schema: dict, ctx: Context, compile_: Compile, names: Node | None = None) -> Node:
    """The JSON text of the objects the schema's object keywords allow; `names`, when given,
    is the language of allowed keys (`propertyNames`, JSON text with quotes)."""
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    patterns = schema.get("patternProperties") or {}
    if not isinstance(properties, dict) or not isinstance(patterns, dict):
        raise GrammarError("JSON Schema 'properties' / 'patternProperties' must be objects")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise GrammarError("JSON Schema keyword 'required' must be a list of strings")
    additional = schema.get("additionalProperties")
    if additional is None:
        additional = not ctx.options.strict
    regexes = {p: pattern_regex(p, CANONICAL_UNIT) for p in patterns}

    def matches(rx: str, name: str) -> bool:
        text = json_string_text(name)[1:-1]
        try:
            return re.fullmatch(rx, text) is not None
        except re.error:  # e.g. an empty class, which Python's re cannot parse
            return prune_empty(both(literal(text), Regex(rx))) != NEVER

    def matching(name: str) -> list[object]:
        return [patterns[p] for p, rx in regexes.items() if matches(rx, name)]

    def schema_for(name: str, declared: object | None) -> object:
        parts = ([declared] if declared is not None else []) + matching(name)
        if not parts:
            return additional
        return parts[0] if len(parts) == 1 else {"allOf": parts}

    def allowed(name: str) -> bool:
        return names is None or prune_empty(both(literal(json_string_text(name)), names)) != NEVER

    members: list[tuple[str, Node, bool]] = []
    for name, sub in properties.items():
        value = compile_(schema_for(name, sub)) if allowed(name) else NEVER
        members.append((name, value, name in required))
    for name in dict.fromkeys(required):
        if name not in properties:
            value = compile_(schema_for(name, None)) if allowed(name) else NEVER
            members.append((name, value, True))

    declared = union(
        *(literal(json_string_text(n)) for n in dict.fromkeys([*properties, *required]))
    )
    pattern_keys = {p: cat(literal('"'), Regex(rx), literal('"')) for p, rx in regexes.items()}
    extras = []

    def key_language(key: Node) -> Node:
        """Extra names: never empty unless patterns or propertyNames may cover them all."""
        if names is None and not patterns:
            return key
        return prune_empty(key if names is None else both(key, names))

    for p, key in pattern_keys.items():
        others = union(*(k for q, k in pattern_keys.items() if q != p))
        if others != NEVER:
            ctx.approximate("names matching several patternProperties are not generated")
        extras.append((key_language(minus(minus(key, declared), others)), compile_(patterns[p])))
    rest_key = key_language(minus(KEY, union(declared, *pattern_keys.values())))
    extras.append((rest_key, compile_(additional)))
    return _assemble(ctx, members, extras, schema)


def _assemble(
    ctx: Context, members: list[tuple[str, Node, bool]], extras: list[tuple[Node, Node]], schema
) -> Node:
    layout = ctx.layout
    kept: list[tuple[Node, bool]] = []
    for name, value, is_required in members:
        if value == NEVER:
            if is_required:
                return NEVER
            continue
        kept.append((layout.member(literal(json_string_text(name)), value), is_required))
    extra = union(*(layout.member(k, v) for k, v in extras if v != NEVER and k != NEVER))
    n_required = sum(1 for _, r in kept if r)
    n_optional = len(kept) - n_required
    lo = count_keyword(schema, "minProperties") or 0
    hi = count_keyword(schema, "maxProperties")
    most = None if extra != NEVER else n_required + n_optional
    if (hi is not None and hi < max(lo, n_required)) or (most is not None and lo > most):
        return NEVER
    # Which counts the layout below can enforce: at least one member when lo == 1, and exact
    # counts of extra members when every declared member is required.
    extra_lo, extra_hi = 0, None
    if n_optional == 0:
        extra_lo = max(lo - n_required, 0)
        extra_hi = None if hi is None else hi - n_required
    elif lo > max(n_required, 1) or (hi is not None and (most is None or hi < most)):
        raise GrammarError(
            "JSON Schema keywords 'minProperties' / 'maxProperties' are only supported when "
            "they are implied by the properties or bound extra members next to required ones"
        )
    chain = None
    tail: list[Node] = []  # past the first required member the chain only grows: cat once
    seen_required = False
    for member, is_required in kept:
        if chain is None:
            chain = member
        else:
            step = cat(layout.comma, member)
            piece = step if is_required else optional(step)
            if seen_required:
                tail.append(piece)
            else:
                chain = union(cat(chain, piece), member)
        seen_required = seen_required or is_required
    if tail:  # the same tree as growing it member by member, without copying it each time
        chain = cat(chain, *tail)
    options = []
    if chain is not None:
        options.append(cat(chain, repeat(cat(layout.comma, extra), extra_lo, extra_hi)))
    if not seen_required and extra != NEVER:
        rest_hi = None if extra_hi is None else extra_hi - 1
        options.append(layout.separated(extra, extra, max(extra_lo - 1, 0), rest_hi))
    empty_ok = not seen_required and extra_lo == 0 and lo == 0
    return layout.container("{", "}", union(*options), empty_ok)
