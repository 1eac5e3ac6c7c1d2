"""Keywords that choose or negate: `oneOf`, `not`, `if` / `then` / `else`,
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
- `oneOf`: branches that are provably disjoint are alternatives; an object branch
  overlapping another is narrowed so that the other cannot match (a name the other requires
  is forbidden, possibly inside a shared required property, or a name the other, closed,
  branch does not declare is required: a documented subset); other overlaps are subtracted
  with `Minus`; anything else raises.
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
from tgix.grammar.json_common import NEVER, both, minus, prune_empty, union
from tgix.grammar.json_compose import disjoint
from tgix.grammar.json_keywords import (
    ALL_TYPES,
    KEYWORDS_BY_TYPE,
    OBJECT_KEYWORDS,
    asserts,
    type_set,
)
from tgix.grammar.regex_tree import Node

if TYPE_CHECKING:
    from tgix.grammar.json_schema import Converter

MAX_VARIANTS = 8


def unsupported(keyword: str, detail: str = "") -> GrammarError:
    return GrammarError(f"JSON Schema keyword {keyword!r} is not supported{detail}")


def _flat(conv: Converter, schema: object) -> object:
    merged, _ = conv.merger.merge_all([schema])
    conv.merger.take_inlined()
    return merged


def _types(schema: object) -> frozenset[str]:
    if isinstance(schema, dict):
        return type_set(schema)
    return ALL_TYPES if schema is True else frozenset()


def _type_list(types: frozenset[str]) -> list[str]:
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
    schema = _flat(conv, schema)
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
        return [{"type": _type_list(others)}] if others else []
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
    keep = _flat(conv, rest)
    if keep is False:
        return NEVER
    flat = _flat(conv, negated)
    if not _types(keep) & _types(flat):
        return conv.compile(rest)
    variants = _negate(conv, negated)
    if variants is not None:
        return union(*(conv.compile_all([rest, v]) for v in variants))
    # only values of the types `negated` can reject survive; subtract it there
    failing = (ALL_TYPES - _types(flat)) | _partial_types(flat)
    types = {"type": _type_list(_types(keep) & failing)}
    return subtract(conv, {"allOf": [rest, types]}, [negated], "not")


def subtract(conv: Converter, keep: object, drops: list, keyword: str) -> Node:
    """`keep` minus the union of `drops`. Types a drop accepts whole (its keywords do not
    apply to them) are taken out of `keep`; where a drop accepts part of a type, `Minus`
    subtracts it, all compiled in canonical spelling: those parts must compile exactly and be
    scalars."""
    types = _types(_flat(conv, keep))
    parts = []
    for drop in drops:
        flat = _flat(conv, drop)
        accepted = _types(flat) & types
        partial = _partial_types(flat)
        if "integer" in accepted - partial and "number" in types - accepted:
            partial |= {"integer"}  # all integers of the numbers: a subtraction
        types -= accepted - partial
        parts.append((drop, accepted & partial))
    saved, conv.canonical = conv.canonical, True
    try:
        kept = conv.compile({"allOf": [keep, {"type": _type_list(types)}]})
        nodes = []
        for drop, part in parts:
            part &= types
            if not part:
                continue
            drop = {"allOf": [drop, {"type": _type_list(part)}]}
            if part & {"object", "array"}:
                raise unsupported(
                    keyword, f" here: it would subtract objects or arrays ({_brief(drop)})"
                )
            before = conv.ctx.approximations
            nodes.append(conv.compile(drop))
            if conv.ctx.approximations != before:
                raise unsupported(
                    keyword, f" here: it would subtract an approximation ({_brief(drop)})"
                )
    finally:
        conv.canonical = saved
    return prune_empty(minus(kept, union(*nodes)))


def _brief(schema: object) -> str:
    text = json.dumps(schema, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def _object_only(schema: object) -> bool:
    """Only object keywords: every non-object value satisfies the schema."""
    if not isinstance(schema, dict) or not asserts(schema):
        return False
    return all(k in OBJECT_KEYWORDS or not asserts({k: v}) for k, v in schema.items())


def compile_one_of(conv: Converter, rest: dict, branches: list) -> Node:
    alone = [_flat(conv, b) for b in branches]
    if len(branches) > 1 and all(_object_only(b) for b in alone):
        # a non-object satisfies every branch, so more than one: only objects qualify
        branches = [{"allOf": [b, {"type": "object"}]} for b in branches]
    flat = [_flat(conv, {"allOf": [rest, b]}) for b in branches]
    cache: dict[tuple[str, str], bool] = {}

    def probe(a: dict, b: dict) -> bool:
        key = (json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True))
        if key not in cache:
            cache[key] = cache[key[::-1]] = _grammars_disjoint(conv, a, b)
        return cache[key]

    overlaps = [
        [
            j
            for j in range(len(flat))
            if j != i and not disjoint(flat[i], flat[j], conv.resolve, probe)
        ]
        for i in range(len(flat))
    ]
    nodes = []
    for i, branch in enumerate(branches):
        mine = {"allOf": [rest, branch]}
        if not overlaps[i]:
            nodes.append(conv.compile(mine))
        elif any(_implies(flat[i], alone[j]) for j in overlaps[i]):
            conv.ctx.note(f"oneOf branch {i} lies inside another branch: never valid")
        elif isinstance(flat[i], dict) and type_set(flat[i]) <= {"object"}:
            nodes.append(_exclude_required(conv, mine, flat, i, overlaps[i], probe))
        else:
            drops = [{"allOf": [rest, branches[j]]} for j in overlaps[i]]
            nodes.append(subtract(conv, mine, drops, "oneOf"))
    return union(*nodes)


def _implies(mine: object, theirs: object) -> bool:
    """`mine` accepts only values `theirs` accepts, in the simple case where `theirs` only
    requires names `mine` requires too."""
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return False
    keys = {k for k in theirs if asserts({k: theirs[k]})}
    if not keys <= {"required", "type"} or type_set(mine) - type_set(theirs):
        return False
    return set(theirs.get("required", [])) <= set(mine.get("required", [])) and "object" in (
        type_set(mine) if "type" not in theirs else type_set(theirs)
    )


def _grammars_disjoint(conv: Converter, a: dict, b: dict) -> bool:
    """Two scalar schemas share no value: their exact canonical grammars do not intersect."""
    saved, conv.canonical = conv.canonical, True
    before, notes = conv.ctx.approximations, len(conv.ctx.notes)
    try:
        node = both(conv.compile(a), conv.compile(b))
    except GrammarError:
        return False
    finally:
        conv.canonical = saved
    exact = conv.ctx.approximations == before
    conv.ctx.approximations = before  # a probe, not part of the grammar
    del conv.ctx.notes[notes:]
    return exact and prune_empty(node) == NEVER


def _exclude_required(conv: Converter, mine: dict, flat: list, i: int, others: list, probe) -> Node:
    """Object branch i without the objects the other branches could also accept: a subset of
    "i and not the others" (see `_separator`)."""
    extra = []
    for j in others:
        separator = _separator(conv, flat[i], flat[j], probe, 0)
        if separator is None:
            pair = f"{_brief(flat[i])} / {_brief(flat[j])}"
            raise unsupported("oneOf", f": branches {i} and {j} may overlap ({pair})")
        extra.append(separator)
        conv.ctx.approximate(
            f"oneOf branch {i}: objects that branch {j} could accept are not generated"
        )
    return conv.compile_all([mine, *extra])


def _separator(conv: Converter, mine: object, theirs: object, probe, depth: int) -> object:
    """A schema that, added to object schema `mine`, excludes every object `theirs` accepts:
    `false` if `theirs` accepts every object; else forbid a name `theirs` requires; or, under
    a name both require, such a condition on the value; or require a name whose values the two
    schemas keep disjoint; or, if `theirs` is closed, require a name only `mine` declares.
    None if none of these applies."""
    if not isinstance(mine, dict) or not isinstance(theirs, dict) or depth > 3:
        return None
    plain = all(k in ("type", "properties") or not asserts({k: v}) for k, v in theirs.items())
    if plain and not any(asserts(v) for v in theirs.get("properties", {}).values()):
        return False  # `theirs` accepts every object
    required = mine.get("required", [])
    props = mine.get("properties", {})
    names = [n for n in theirs.get("required", []) if n not in required]
    if names:
        names.sort(key=lambda n: n in props)
        return {"properties": {names[0]: False}}
    for name in theirs.get("required", []):
        sub_mine = _flat(conv, props.get(name, True))
        sub_theirs = _flat(conv, theirs.get("properties", {}).get(name, True))
        if isinstance(sub_mine, dict) and type_set(sub_mine) <= {"object"}:
            inner = _separator(conv, sub_mine, sub_theirs, probe, depth + 1)
            if inner is not None:
                return {"properties": {name: inner}}
    their_props = theirs.get("properties", {})
    for name, sub in props.items():
        if name in their_props and disjoint(sub, their_props[name], conv.resolve, probe):
            return {"required": [name]}
    closed = theirs.get("additionalProperties") is False and "patternProperties" not in theirs
    if closed:
        only_mine = [
            n for n in props if n not in theirs.get("properties", {}) and props[n] is not False
        ]
        if only_mine:
            return {"required": [only_mine[0]]}
    return None


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
