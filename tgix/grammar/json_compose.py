"""Schema-level composition: `allOf` merging and `oneOf` disjointness, before any grammar is
built.

Merging turns a conjunction of schemas into one schema when the keywords allow it (types
intersected, enums intersected, bounds tightened, properties united with each side's
`additionalProperties` applied to the names only the other side declares, `items` combined
position by position). That matters for objects: the grammar fixes the property order, so
intersecting two object grammars that order different names would lose most objects. What
cannot be merged (two `pattern`s become a tuple the string compiler intersects; two `anyOf`s,
`patternProperties` on both sides) is returned as residual schemas, intersected (`Both`) by
the caller.

`disjoint` is a conservative test that two schemas share no instance (different types,
disjoint enums or number intervals, a required property with disjoint schemas, a closed
object missing a property the other requires); `oneOf` over disjoint branches is `anyOf`.
"""

from __future__ import annotations

from collections.abc import Callable

from tgix.grammar.json_common import json_equal
from tgix.grammar.json_keywords import (
    ASSERTIONS,
    bounds_keywords,
    declared_types,
    enum_values,
    numeric_bounds,
    tighter,
    type_set,
)

Resolve = Callable[[str], object]

COMPOSITION = ("allOf", "anyOf", "oneOf")
_MIN_KEYS = ("minLength", "minItems", "minProperties")
_MAX_KEYS = ("maxLength", "maxItems", "maxProperties")
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_MULTI_KEYS = ("pattern", "format", "multipleOf")
_OBJECT_KEYS = ("properties", "patternProperties", "additionalProperties")
_ARRAY_KEYS = ("items", "prefixItems", "additionalItems")


class MergeFailed(Exception):
    """Two schemas whose conjunction is not one schema (the caller intersects grammars)."""


def conj(a: object, b: object) -> object:
    """The conjunction of two schemas, without merging."""
    if a is True or a == {}:
        return b
    if b is True or b == {} or a == b:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


class Merger:
    """Merges schemas; `resolve` maps a `$ref` to its target, `ignore_ref_siblings` is
    draft 4-7 (keywords next to `$ref` have no effect)."""

    def __init__(self, resolve: Resolve, ignore_ref_siblings: bool):
        self.resolve = resolve
        self.ignore_ref_siblings = ignore_ref_siblings
        self.inlined: list[str] = []

    def take_inlined(self) -> list[str]:
        """The `$ref`s whose targets merging copied in since the last call (the caller counts
        them as expanded, for the recursion bound)."""
        out, self.inlined = self.inlined, []
        return out

    def merge_all(self, parts: list) -> tuple[object, list]:
        """One schema and the residual schemas that must also hold."""
        result: object = True
        residual: list = []
        for part in parts:
            try:
                result, extra = self._merge(result, part, ())
            except MergeFailed:
                extra = [part]
            residual.extend(extra)
        return result, residual

    def _flatten(self, schema: object, refs: tuple) -> tuple[object, list]:
        if not isinstance(schema, dict):
            return schema, []
        if "$ref" in schema:
            ref = schema["$ref"]
            if ref in refs or len(refs) > 16:
                raise MergeFailed
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            target = self.resolve(ref)
            self.inlined.append(ref)
            if self.ignore_ref_siblings:
                return self._flatten(target, (*refs, ref))
            base, residual = self._flatten(target, (*refs, ref))
            merged, more = self._merge(base, rest, (*refs, ref))
            return merged, residual + more
        if "allOf" in schema:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            result, residual = rest, []
            for part in schema["allOf"]:
                result, extra = self._merge(result, part, refs)
                residual.extend(extra)
            return result, residual
        return schema, []

    def _merge(self, a: object, b: object, refs: tuple) -> tuple[object, list]:
        a, residual_a = self._flatten(a, refs)
        b, residual_b = self._flatten(b, refs)
        residual = residual_a + residual_b
        if a is False or b is False:
            return False, []
        if a is True:
            return b, residual
        if b is True:
            return a, residual
        return merge_dicts(a, b, residual), residual


DISTRIBUTE_BRANCHES = 8  # the most conjunctions distribute_any_of turns one allOf into


def distribute_any_of(parts: list) -> list[list] | None:
    """allOf(A, anyOf(B1, B2), C) as [[A, B1, C], [A, B2, C]] (exact: conjunction distributes
    over disjunction), None when no part is an `anyOf` over object branches or the product
    of branches would pass DISTRIBUTE_BRANCHES. Merging keeps each branch's properties in
    their place among the parts: merged afterwards, as `merge_dicts` does with `anyOf`
    residuals, they would all come after the other parts' properties, and the grammar fixes
    the order of properties."""
    choices, total = [], 1
    for part in parts:
        branches = part.get("anyOf") if isinstance(part, dict) and "$ref" not in part else None
        if not isinstance(branches, list) or not any(_declares_members(b) for b in branches):
            choices.append([part])
            continue
        rest = {k: v for k, v in part.items() if k != "anyOf"}
        choices.append([(rest, b) for b in branches])
        total *= len(branches)
    if total == 1 or total > DISTRIBUTE_BRANCHES:
        return None
    out: list[list] = [[]]
    for options in choices:
        out = [[*done, *(c if isinstance(c, tuple) else (c,))] for done in out for c in options]
    return out


def _declares_members(schema: object) -> bool:
    return isinstance(schema, dict) and ("properties" in schema or "required" in schema)


def merge_dicts(a: dict, b: dict, residual: list) -> dict | bool:
    """Keyword-wise conjunction of two schemas without `$ref` / `allOf`; keywords that do not
    combine go to `residual`; MergeFailed when object or array keywords cannot be combined."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif out[key] == value:
            continue
        elif key in ("anyOf", "oneOf"):
            residual.append({key: value})
        elif key in _MIN_KEYS:
            out[key] = max(out[key], value)
        elif key in _MAX_KEYS:
            out[key] = min(out[key], value)
        elif key in _MULTI_KEYS:
            left = out[key] if isinstance(out[key], tuple) else (out[key],)
            right = value if isinstance(value, tuple) else (value,)
            out[key] = tuple(dict.fromkeys(left + right))
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "not":  # not A and not B = not (A or B)
            out[key] = {"anyOf": [out[key], value]}
        elif key in ("type", "enum", "const", *_BOUND_KEYS, *_OBJECT_KEYS, *_ARRAY_KEYS):
            continue  # combined below
        elif key in ASSERTIONS:
            residual.append({key: value})
    types = declared_types(a) & declared_types(b)
    if "type" in a or "type" in b:
        if not types:
            return False
        out["type"] = sorted(types - {"integer"} if "number" in types else types)
    values_a, values_b = enum_values(a), enum_values(b)
    if values_a is not None or values_b is not None:
        values = values_a if values_b is None else values_b
        if values_a is not None and values_b is not None:
            values = [v for v in values_a if any(json_equal(v, w) for w in values_b)]
        out.pop("const", None)
        out["enum"] = values
    if any(k in a for k in _BOUND_KEYS) and any(k in b for k in _BOUND_KEYS):
        for key in _BOUND_KEYS:
            out.pop(key, None)
        out.update(bounds_keywords(tighter(numeric_bounds(a), numeric_bounds(b))))
    if any(k in a for k in _OBJECT_KEYS) and any(k in b for k in _OBJECT_KEYS):
        out.update(_merge_objects(a, b))
    if any(k in a for k in _ARRAY_KEYS) and any(k in b for k in _ARRAY_KEYS):
        for key in _ARRAY_KEYS:
            out.pop(key, None)
        out.update(_merge_arrays(a, b))
    return out


def _merge_objects(a: dict, b: dict) -> dict:
    """Exact when at most one side has `patternProperties` and neither bounds extra names
    (`additionalProperties` absent or true): the patterns then keep applying to every name,
    declared on either side, as they did on their own side."""
    patterns = [s["patternProperties"] for s in (a, b) if "patternProperties" in s]
    if len(patterns) > 1 or (patterns and not all(_open(s) for s in (a, b))):
        raise MergeFailed
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    extra_a = a.get("additionalProperties", True)
    extra_b = b.get("additionalProperties", True)
    properties = {}
    for name in dict.fromkeys([*props_a, *props_b]):
        properties[name] = conj(props_a.get(name, extra_a), props_b.get(name, extra_b))
    out: dict = {"properties": properties}
    if "additionalProperties" in a or "additionalProperties" in b:
        out["additionalProperties"] = conj(extra_a, extra_b)
    if patterns:
        out["patternProperties"] = patterns[0]
    return out


def _open(schema: dict) -> bool:
    return schema.get("additionalProperties", True) in (True, {})


def _tuple_form(schema: dict) -> tuple[list, object]:
    items = schema.get("items", True)
    if "prefixItems" in schema:
        return list(schema["prefixItems"]), items
    if isinstance(items, list):
        return list(items), schema.get("additionalItems", True)
    return [], items


def _merge_arrays(a: dict, b: dict) -> dict:
    tuple_a, rest_a = _tuple_form(a)
    tuple_b, rest_b = _tuple_form(b)
    n = max(len(tuple_a), len(tuple_b))
    prefix = [
        conj(tuple_a[i] if i < len(tuple_a) else rest_a, tuple_b[i] if i < len(tuple_b) else rest_b)
        for i in range(n)
    ]
    out = {"items": conj(rest_a, rest_b)}
    if prefix:
        out["prefixItems"] = prefix
    return out


Probe = Callable[[dict, dict], bool]
SCALARS = frozenset({"null", "boolean", "number", "integer", "string"})


def disjoint(a: object, b: object, resolve: Resolve, probe: Probe | None = None, depth=0) -> bool:
    """True only if no JSON value satisfies both schemas (a conservative test). Every check
    reads conjunctive keywords, so extra `anyOf`/`oneOf`/... next to them cannot break it.
    `probe(a, b)` decides two scalar-only schemas the keywords do not separate (e.g. two
    patterns), by intersecting their grammars."""
    a, b = _plain_ref(a, resolve), _plain_ref(b, resolve)
    if a is False or b is False:
        return True
    if (
        not isinstance(a, dict)
        or not isinstance(b, dict)
        or depth > 4
        or "$ref" in a
        or "$ref" in b
    ):
        return False
    common = type_set(a) & type_set(b)
    if not common:
        return True
    values_a, values_b = enum_values(a), enum_values(b)
    if values_a is not None and values_b is not None:
        return not any(json_equal(v, w) for v in values_a for w in values_b)
    numbers_only = common <= {"number", "integer"}
    if numbers_only and _empty_interval(*tighter(numeric_bounds(a), numeric_bounds(b))):
        return True
    if common == {"object"}:
        return _objects_disjoint(a, b, resolve, probe, depth) or _objects_disjoint(
            b, a, resolve, probe, depth
        )
    return probe is not None and common <= SCALARS and probe(a, b)


def _empty_interval(lo, lo_strict: bool, hi, hi_strict: bool) -> bool:
    if lo is None or hi is None:
        return False
    return lo > hi or (lo == hi and (lo_strict or hi_strict))


def _objects_disjoint(a: dict, b: dict, resolve: Resolve, probe: Probe | None, depth) -> bool:
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    closed_a = a.get("additionalProperties") is False and "patternProperties" not in a
    required_b = b.get("required", [])
    for name in required_b:
        if props_a.get(name) is False or (closed_a and name not in props_a):
            return True
        both_have = name in a.get("required", []) and name in props_a and name in props_b
        if both_have and disjoint(props_a[name], props_b[name], resolve, probe, depth + 1):
            return True
    return False


def _plain_ref(schema: object, resolve: Resolve) -> object:
    for _ in range(8):
        if isinstance(schema, dict) and set(schema) == {"$ref"}:
            schema = resolve(schema["$ref"])
        else:
            break
    return schema
