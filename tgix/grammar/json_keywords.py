"""Reading schema keywords: which keywords exist (by the type they apply to), whether a
schema asserts anything, the types and enum values a schema allows, and number bounds in
both the draft-4 (boolean `exclusiveMinimum`) and draft-6+ forms."""

from __future__ import annotations

from decimal import Decimal

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import json_equal, json_type

ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
OBJECT_KEYWORDS = frozenset(
    {"properties", "required", "additionalProperties", "patternProperties", "minProperties"}
    | {"maxProperties", "propertyNames", "dependentRequired", "dependentSchemas"}
    | {"dependencies", "unevaluatedProperties"}
)
ARRAY_KEYWORDS = frozenset(
    {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}
    | {"contains", "minContains", "maxContains", "unevaluatedItems"}
)
LOGIC_KEYWORDS = frozenset({"not", "if", "then", "else", "$dynamicRef", "$recursiveRef"})
GENERIC_KEYWORDS = frozenset({"type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf"})
ASSERTIONS = (
    STRING_KEYWORDS | NUMBER_KEYWORDS | OBJECT_KEYWORDS | ARRAY_KEYWORDS | GENERIC_KEYWORDS
) | LOGIC_KEYWORDS
KEYWORDS_BY_TYPE = {
    "string": STRING_KEYWORDS,
    "number": NUMBER_KEYWORDS,
    "integer": NUMBER_KEYWORDS,
    "object": OBJECT_KEYWORDS,
    "array": ARRAY_KEYWORDS,
    "boolean": frozenset(),
    "null": frozenset(),
}


def asserts(schema: object) -> bool:
    """Whether a schema constrains anything (False for `{}`, annotations, unknown keys)."""
    if isinstance(schema, bool):
        return not schema
    return isinstance(schema, dict) and any(k in ASSERTIONS for k in schema)


def declared_types(schema: dict) -> frozenset[str]:
    """The `type` keyword as a set, 'number' including 'integer'; all types when absent."""
    t = schema.get("type")
    if t is None:
        return ALL_TYPES
    names = frozenset([t] if isinstance(t, str) else t)
    return names | {"integer"} if "number" in names else names


def enum_values(schema: dict) -> list | None:
    """`enum` and `const` combined; None when neither is present."""
    values = None
    if "enum" in schema:
        values = list(schema["enum"]) if isinstance(schema["enum"], list) else None
    if "const" in schema:
        const = schema["const"]
        values = [const] if values is None else [v for v in values if json_equal(v, const)]
    return values


def type_set(schema: dict) -> frozenset[str]:
    """Types of the instances a schema can have, as far as `type` and `enum` tell."""
    types = declared_types(schema)
    values = enum_values(schema)
    if values is not None:
        types &= frozenset(json_type(v) for v in values)
    return types


Bounds = tuple[Decimal | None, bool, Decimal | None, bool]


def to_decimal(value: object, name: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GrammarError(f"JSON Schema keyword {name!r} must be a number")
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def numeric_bounds(schema: dict) -> Bounds:
    """(low, low exclusive, high, high exclusive) from minimum / maximum / exclusiveMinimum /
    exclusiveMaximum, in both the draft-4 (boolean exclusive*) and draft-6+ forms; the
    tightest bound wins."""
    lo: Decimal | None = None
    hi: Decimal | None = None
    lo_strict = hi_strict = False
    for key, upper in (("minimum", False), ("maximum", True)):
        if key in schema:
            value = to_decimal(schema[key], key)
            strict = schema.get("exclusiveM" + key[1:]) is True
            if upper:
                hi, hi_strict = value, strict
            else:
                lo, lo_strict = value, strict
    for key, upper in (("exclusiveMinimum", False), ("exclusiveMaximum", True)):
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            continue
        value = to_decimal(value, key)
        if upper and (hi is None or value <= hi):
            hi, hi_strict = value, True
        elif not upper and (lo is None or value >= lo):
            lo, lo_strict = value, True
    return lo, lo_strict, hi, hi_strict


def tighter(a: Bounds, b: Bounds) -> Bounds:
    """The intersection of two intervals."""
    lo, lo_strict, hi, hi_strict = a
    b_lo, b_lo_strict, b_hi, b_hi_strict = b
    if b_lo is not None and (lo is None or b_lo > lo or (b_lo == lo and b_lo_strict)):
        lo, lo_strict = b_lo, b_lo_strict
    if b_hi is not None and (hi is None or b_hi < hi or (b_hi == hi and b_hi_strict)):
        hi, hi_strict = b_hi, b_hi_strict
    return lo, lo_strict, hi, hi_strict


def bounds_keywords(bounds: Bounds) -> dict:
    """Draft-6+ keywords expressing the interval."""
    lo, lo_strict, hi, hi_strict = bounds
    out: dict = {}
    if lo is not None:
        out["exclusiveMinimum" if lo_strict else "minimum"] = _plain(lo)
    if hi is not None:
        out["exclusiveMaximum" if hi_strict else "maximum"] = _plain(hi)
    return out


def _plain(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


_SCHEMA_VALUED = ("not", "if", "then", "else", "additionalProperties", "propertyNames")
_SCHEMA_VALUED += ("contains", "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")


def check_shape(schema: dict) -> None:
    """GrammarError when a keyword's value has the wrong JSON type (a subschema that is not
    an object or boolean, a `type` that is not a name or list of names, ...)."""

    def is_schema(value: object) -> bool:
        return isinstance(value, dict | bool)

    def fail(key: str, what: str) -> GrammarError:
        return GrammarError(f"JSON Schema keyword {key!r} must be {what}")

    for key in _SCHEMA_VALUED:
        if key in schema and not is_schema(schema[key]):
            raise fail(key, "a schema (an object or a boolean)")
    for key in _SCHEMA_LISTS:
        if key in schema and not (
            isinstance(schema[key], list) and all(map(is_schema, schema[key]))
        ):
            raise fail(key, "an array of schemas")
    for key in _SCHEMA_MAPS:
        value = schema.get(key, {})
        if not (isinstance(value, dict) and all(map(is_schema, value.values()))):
            raise fail(key, "an object whose values are schemas")
    items = schema.get("items", True)
    if not (is_schema(items) or (isinstance(items, list) and all(map(is_schema, items)))):
        raise fail("items", "a schema or an array of schemas")
    t = schema.get("type", [])
    if not (isinstance(t, str) or (isinstance(t, list) and all(isinstance(x, str) for x in t))):
        raise fail("type", "a type name or an array of type names")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise fail("enum", "an array")
    for key in ("dependencies", "dependentRequired"):
        for dep in (schema.get(key) or {}).values() if isinstance(schema.get(key), dict) else ():
            names = isinstance(dep, list) and all(isinstance(n, str) for n in dep)
            if not names and (key == "dependentRequired" or not is_schema(dep)):
                raise fail(key, "an object of name lists (or schemas, for 'dependencies')")
