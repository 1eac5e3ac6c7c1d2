"""Keywords that negate or condition: `not`, `if` / `then` / `else`,
`dependentRequired` / `dependentSchemas` / `dependencies`.

A regular language is closed under difference, but the object grammar fixes the property
order, so a difference of two object grammars would let through objects that the subtracted
schema accepts in another order. Negation is therefore rewritten at the schema level where it
concerns objects, and done by `Minus` only where the subtracted grammar is exact and holds no
objects or arrays (everything then in canonical spelling, so no value has a second text):
- `not`: not (k1 and k2 ...) is (not k1) or (not k2) ..., a union of schemas when every
  keyword has a rule: `type` (complemented), `required` ("lacks a name"), `properties`
  ("has a property whose value fails its schema"), min/max counts (the complementary bound),
  `items: false`, `not`, `allOf`, `anyOf` (product of the alternatives); at most 8 in all.
  Otherwise, restricted to the types its keywords can reject, `Minus` (scalars only).
- `oneOf`: json_oneof (subtraction through `subtract` here).
- `if`/`then`/`else`: (if and then) or (not if and else).
- dependencies: for each name, "absent" or "present with its dependency", expanded for up
  to 3 names.
Whatever cannot be expressed raises `GrammarError` naming the keyword.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import NEVER, minus, prune_empty, union
from tgix.grammar.json_keywords import (
    ALL_TYPES,
    KEYWORDS_BY_TYPE,
    asserts,
    type_set,
)
from tgix.grammar.regex_tree import Node

if TYPE_CHECKING:
    from tgix.grammar.json_schema import Converter

MAX_VARIANTS = 8


def unsupported(keyword: str, detail: str = "") -> GrammarError:
    return GrammarError(f"JSON Schema keyword {keyword!r} is not supported{detail}")


def flat_schema(conv: Converter, schema: object) -> object:
    merged, _ = conv.merger.merge_all([schema])
    conv.merger.take_inlined()
    return merged


def types_of(schema: object) -> frozenset[str]:
    if isinstance(schema, dict):
        return type_set(schema)
    return ALL_TYPES if schema is True else frozenset()


def type_list(types: frozenset[str]) -> list[str]:
    return sorted(types - {"integer"} if "number" in types else types)


_COUNTS = {  # keyword: (type, complementary keyword, offset)
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}


def _negate(conv: Converter, schema: object, depth: int = 0) -> list | None:
    """Schemas whose union is the complement of `schema`, or None when that takes a
    subtraction of grammars. not (k1 and k2 ...) = (not k1) or (not k2) ..., each keyword
    negated by a rule; keywords without one (enum, pattern, minimum, ...) give None."""
    schema = flat_schema(conv, schema)
    if schema is False:
        return [True]
    if not asserts(schema):
        return []
    if depth > 3:
        return None
    variants: list = []
    for key, value in schema.items():
        if not asserts({key: value}):
            continue
        negated = _negate_keyword(conv, key, value, depth)
        if negated is None:
            return None
        variants.extend(negated)
    return variants if len(variants) <= MAX_VARIANTS else None


def _negate_keyword(conv: Converter, key: str, value: object, depth: int) -> list | None:
    if key == "type":
        others = ALL_TYPES - type_set({"type": value})
        if "number" in others and "integer" not in others:
            return None  # "a number that is not an integer" is a subtraction
        return [{"type": type_list(others)}] if others else []
    if key == "required":
        return [{"type": "object", "properties": {name: False}} for name in value]
    if key == "properties":
        return [
            {"type": "object", "required": [name], "properties": {name: {"not": sub}}}
            for name, sub in value.items()
            if asserts(sub)
        ]
    if key in _COUNTS and isinstance(value, int):
        kind, other, offset = _COUNTS[key]
        bound = value + offset
        return [] if bound < 0 else [{"type": kind, other: bound}]
    if key == "items" and value is False:
        return [{"type": "array", "minItems": 1}]
    if key == "not":
        return [value]
    if key == "allOf":
        parts = [_negate(conv, b, depth + 1) for b in value]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    if key == "anyOf":
        parts = [_negate(conv, b, depth + 1) for b in value]
        if any(p is None for p in parts):
            return None
        combos = list(itertools.islice(itertools.product(*parts), MAX_VARIANTS + 1))
        return None if len(combos) > MAX_VARIANTS else [{"allOf": list(c)} for c in combos]
    return None


def _partial_types(schema: object) -> frozenset[str]:
    """Types of which a schema may reject some values but not all: those its keywords other
    than `type` apply to (a string always passes `{"minimum": 1}`); every type when it has
    `enum`, `const` or composition."""
    if not isinstance(schema, dict):
        return frozenset()
    families = [t for t, words in KEYWORDS_BY_TYPE.items() if any(k in words for k in schema)]
    own = {k for k in schema if k != "type" and asserts({k: schema[k]})}
    if own - set().union(*KEYWORDS_BY_TYPE.values()):
        return ALL_TYPES
    return frozenset(families) | ({"integer"} if "number" in families else set())


def compile_not(conv: Converter, rest: dict, negated: object) -> Node:
    """`rest` and not `negated`."""
    keep = flat_schema(conv, rest)
    if keep is False:
        return NEVER
    flat = flat_schema(conv, negated)
    if not types_of(keep) & types_of(flat):
        return conv.compile(rest)
    variants = _negate(conv, negated)
    if variants is not None:
        return union(*(conv.compile_all([rest, v]) for v in variants))
    # only values of the types `negated` can reject survive; subtract it there
    failing = (ALL_TYPES - types_of(flat)) | _partial_types(flat)
    types = {"type": type_list(types_of(keep) & failing)}
    return subtract(conv, {"allOf": [rest, types]}, [negated], "not")


def subtract(conv: Converter, keep: object, drops: list, keyword: str) -> Node:
    """`keep` minus the union of `drops`. Types a drop accepts whole (its keywords do not
    apply to them) are taken out of `keep`; where a drop accepts part of a type, `Minus`
    subtracts it, all compiled in canonical spelling: those parts must compile exactly and be
    scalars."""
    types = types_of(flat_schema(conv, keep))
    parts = []
    for drop in drops:
        flat = flat_schema(conv, drop)
        accepted = types_of(flat) & types
        partial = _partial_types(flat)
        if "integer" in accepted - partial and "number" in types - accepted:
            partial |= {"integer"}  # all integers of the numbers: a subtraction
        types -= accepted - partial
        parts.append((drop, accepted & partial))
    saved, conv.canonical = conv.canonical, True
    try:
        kept = conv.compile({"allOf": [keep, {"type": type_list(types)}]})
        nodes = []
        for drop, part in parts:
            part &= types
            if not part:
                continue
            drop = {"allOf": [drop, {"type": type_list(part)}]}
            if part & {"object", "array"}:
                raise unsupported(
                    keyword, f" here: it would subtract objects or arrays ({brief(drop)})"
                )
            before = conv.ctx.approximations
            nodes.append(conv.compile(drop))
            if conv.ctx.approximations != before:
                raise unsupported(
                    keyword, f" here: it would subtract an approximation ({brief(drop)})"
                )
    finally:
        conv.canonical = saved
    return prune_empty(minus(kept, union(*nodes)))


def brief(schema: object) -> str:
    text = json.dumps(schema, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def compile_if(conv: Converter, rest: dict, schema: dict) -> Node:
    """(if and then) or (not if and else)."""
    condition = schema["if"]
    then, else_ = schema.get("then", True), schema.get("else", True)
    try:
        otherwise = conv.compile_all([rest, else_, {"not": condition}])
    except GrammarError as e:
        raise unsupported("if", f" here ({e})") from e
    return union(conv.compile_all([rest, condition, then]), otherwise)


def dependency_variants(schema: dict) -> list[list] | None:
    """For each dependency, the schemas "name absent" and "name present with its
    dependency"; None when there are none."""
    deps: dict[str, object] = {}
    for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
        value = schema.get(keyword) or {}
        if not isinstance(value, dict):
            raise GrammarError(f"JSON Schema keyword {keyword!r} must be an object")
        deps.update(value)
    if not deps:
        return None
    if len(deps) > 3:
        raise unsupported("dependencies", " with more than 3 names")
    choices = []
    for name, dep in deps.items():
        present = (
            {"required": [name, *dep]}
            if isinstance(dep, list)
            else {"required": [name], "allOf": [dep]}
        )
        choices.append([{"properties": {name: False}}, present])
    return [list(c) for c in itertools.product(*choices)]
