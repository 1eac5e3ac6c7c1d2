"""JSON Schema -> regex tree -> byte DFA: per feature, valid instances accepted and invalid
ones rejected (checked against `jsonschema` too), unsupported keywords raise by name."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from tests.grammar.json_helpers import accepts_text, check, grammar, notes, texts
from tgix.grammar.automaton import build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_schema import schema_to_tree
from tgix.grammar.options import GrammarOptions
from tgix.grammar.regex_tree import Regex, Repeat

STRICT = GrammarOptions(strict=True)


# --- types --------------------------------------------------------------------------------


def test_scalar_types():
    check({"type": "string"}, valid=["", "a b", "é"], invalid=[1, None])
    check({"type": "integer"}, valid=[0, -7, 123456789012345678901], invalid=[1.5, "1", True])
    check({"type": "number"}, valid=[0, -7, 1.5, 1e-7, 2.5e300], invalid=["1", None, False])
    check({"type": "boolean"}, valid=[True, False], invalid=[0, "true", None])
    check({"type": "null"}, valid=[None], invalid=[0, "", False])


def test_type_array_and_integer_inside_number():
    check({"type": ["string", "null"]}, valid=["x", None], invalid=[1, True, []])
    check({"type": ["integer", "number"]}, valid=[1, 1.5], invalid=["1"])
    check({"type": ["integer", "boolean"]}, valid=[3, True], invalid=[3.5, None])


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("0", True),
        ("-0", True),
        ("01", False),
        ("1.", False),
        (".5", False),
        ("1e5", True),
        ("1E+5", True),
        ("1.5e-3", True),
        ("-", False),
        ("+1", False),
        ("1e", False),
    ],
)
def test_number_text_follows_json_grammar(text, ok):
    assert accepts_text({"type": "number"}, text) is ok


def test_no_whitespace_outside_the_top_level_value():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts_text(schema, '{"a": 1}')
    assert not accepts_text(schema, ' {"a": 1}')
    assert not accepts_text(schema, '{"a": 1} ')
    assert not accepts_text(schema, '{"a" : 1}')  # no whitespace before ':'
    assert not accepts_text(schema, '{"a":  1}')  # default whitespace is at most one space


def test_custom_whitespace_pattern():
    options = GrammarOptions(whitespace=r"[ \n]{0,3}")
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {}}}}
    pretty = json.dumps({"a": [1, 2]}, indent=1)
    assert accepts_text(schema, pretty, options)
    assert not accepts_text(schema, pretty)


# --- objects ------------------------------------------------------------------------------


def test_optional_properties_every_subset_in_schema_order():
    names = ["a", "b", "c", "d"]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "required": ["c"],
        "additionalProperties": False,
    }
    for size in range(len(names) + 1):
        for subset in itertools.combinations(names, size):
            value = {n: 1 for n in subset}
            ok = "c" in subset
            for text in texts(value):
                assert accepts_text(schema, text) is ok, text
    # declared order is the generation order; no stray commas
    for text in [
        '{"c": 1, "a": 1}',
        '{, "c": 1}',
        '{"c": 1,}',
        '{"a": 1 "c": 1}',
        '{"c":1,,"d":1}',
    ]:
        assert not accepts_text(schema, text), text


def tree_size(node) -> int:
    """Characters of regex source in the tree, shared subtrees counted each time."""
    if isinstance(node, Regex):
        return len(node.source)
    children = getattr(node, "parts", None) or getattr(node, "options", None)
    if children is None:
        children = [node.node] if isinstance(node, Repeat) else [node.keep, node.drop]
    return sum(tree_size(c) for c in children)


def test_many_optional_properties_stay_linear():
    """60 optional properties: the tree grows linearly and the DFA builds quickly."""

    def size(n):
        schema = {
            "type": "object",
            "properties": {f"p{i}": {"type": "boolean"} for i in range(n)},
            "additionalProperties": False,
        }
        return schema, tree_size(schema_to_tree(schema)[0])

    (schema, s60), (_, s30) = size(60), size(30)
    assert s60 < 2.2 * s30
    t0 = time.monotonic()
    dfa = build_dfa(schema_to_tree(schema)[0])
    assert time.monotonic() - t0 < 10
    assert dfa.accepts(b'{"p3": true, "p59": false}')
    assert not dfa.accepts(b'{"p59": false, "p3": true}')
    assert dfa.accepts(b"{}")


def test_additional_properties_default_true_and_after_declared():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    check(schema, valid=[{"a": 1}, {"a": 1, "x": [1, {"y": None}]}], invalid=[{"a": "s"}, {}])
    assert not accepts_text(schema, '{"x": 2, "a": 1}')  # extras come after declared ones


def test_extra_keys_must_differ_from_declared_names():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    assert accepts_text(schema, '{"a": 1, "ab": "x"}')
    assert not accepts_text(schema, '{"a": 1, "a": "x"}')
    assert not accepts_text(schema, '{"a": 1, "b": "x", "a": 2}')
    assert not accepts_text(schema, '{"b": "x"}'.replace('"b": "x"', '"a": "s"'))


def test_additional_properties_false_schema_and_strict():
    closed = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": False,
    }
    check(closed, valid=[{}, {"a": 1}], invalid=[{"a": 1, "b": 2}, {"b": 2}])
    typed = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    check(typed, valid=[{"a": 1, "z": "s", "y": ""}, {"q": "s"}], invalid=[{"a": 1, "z": 2}])
    open_ = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts_text(open_, '{"a": 1, "b": 2}')
    assert not accepts_text(open_, '{"a": 1, "b": 2}', STRICT)
    assert accepts_text(open_, '{"a": 1}', STRICT)


def test_map_objects_and_property_counts():
    check(
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
        valid=[{"a": 1}, {"a": 1, "b": 2}],
        invalid=[{}, {"a": "x"}],
    )
    check(
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        valid=[{}, {"a": 1, "b": 2}],
        invalid=[{"a": 1, "b": 2, "c": 3}],
    )
    check(
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1},
        valid=[{"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"a": 1, "c": 3}],
        invalid=[{}],
    )
    with pytest.raises(GrammarError, match="minProperties"):
        schema_to_tree({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2})


def test_required_property_not_declared_and_false_properties():
    check(
        {"type": "object", "required": ["id"], "additionalProperties": {"type": "integer"}},
        valid=[{"id": 1}, {"id": 1, "x": 2}],
        invalid=[{}, {"id": "x"}],
    )
    check(
        {"type": "object", "properties": {"a": False, "b": {"type": "null"}}},
        valid=[{}, {"b": None}, {"c": 1}],
        invalid=[{"a": 1}, {"b": None, "a": 1}],
    )
    with pytest.raises(GrammarError, match="admits no value"):
        schema_to_tree({"type": "object", "properties": {"a": False}, "required": ["a"]})


def test_pattern_properties():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "string"}},
        "additionalProperties": False,
    }
    check(schema, valid=[{"id": 1, "x-a": "s"}, {"x-": ""}], invalid=[{"x-a": 1}, {"y": "s"}])


# --- enum / const -------------------------------------------------------------------------


def test_enum_of_any_json_values():
    values = ['say "hi"', "back\\slash", "tab\t", "ctl\x01", "é😀", 1, 2.5, None, True]
    values += [{"k": [1, "x"]}, [], {}, [None, {"a": False}]]
    check({"enum": values}, valid=values, invalid=["say hi", 3, False, {"k": [1]}, [None]])
    # strings are spelled exactly as json.dumps(ensure_ascii=False) does
    assert accepts_text({"enum": ["é"]}, '"é"')
    assert not accepts_text({"enum": ["é"]}, '"\\u00e9"')


def test_enum_numbers_by_value_and_booleans_distinct():
    check({"enum": [1]}, valid=[1, 1.0], invalid=[True, 2])
    check({"const": 2.0}, valid=[2], invalid=[2.5])
    check({"const": False}, valid=[False], invalid=[0])
    check({"enum": ["a", 1, None], "type": "string"}, valid=["a"], invalid=[1, None])
    check({"enum": ["a", "abc"], "maxLength": 2}, valid=["a"], invalid=["abc"])


# --- $ref ---------------------------------------------------------------------------------


def test_local_refs_defs_definitions_and_pointer_escapes():
    schema = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/pos"},
            "b": {"$ref": "#/definitions/a~1b"},
            "c": {"$ref": "#/definitions/t~0x%20y"},
        },
        "$defs": {"pos": {"type": "integer", "minimum": 1}},
        "definitions": {"a/b": {"type": "string"}, "t~x y": {"type": "boolean"}},
    }
    check(schema, valid=[{"a": 1, "b": "s", "c": True}], invalid=[{"a": 0}, {"b": 1}, {"c": 1}])


def test_recursive_ref_unrolled_and_reported():
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    deep = {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}
    check(schema, valid=[{"v": 1}, deep], invalid=[{"kids": []}, {"v": 1, "kids": [{}]}])
    assert any("#/$defs/node" in n and "depth 3" in n for n in notes(schema))
    too_deep = {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3, "kids": [{"v": 4}]}]}]}
    assert not accepts_text(schema, json.dumps(too_deep))
    two = GrammarOptions(max_recursion_depth=2)
    assert not accepts_text(schema, json.dumps(deep), two)


def test_root_recursion_and_recursion_without_alternative():
    linked = {
        "type": "object",
        "properties": {"next": {"$ref": "#"}},
        "additionalProperties": False,
    }
    check(linked, valid=[{}, {"next": {"next": {}}}], invalid=[{"next": 1}])
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    with pytest.raises(GrammarError, match="recursive"):
        schema_to_tree(endless)


def test_ref_errors():
    with pytest.raises(GrammarError, match="external"):
        schema_to_tree({"$ref": "https://example.com/other.json"})
    with pytest.raises(GrammarError, match="does not resolve"):
        schema_to_tree({"$ref": "#/$defs/missing"})


def test_ref_siblings_intersected_from_2019_and_ignored_in_draft7():
    defs = {"$defs": {"s": {"type": "string"}}}
    modern = {"$ref": "#/$defs/s", "maxLength": 2, **defs}
    check(modern, valid=["ab"], invalid=["abc", 1])
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **modern}
    check(draft7, valid=["ab", "abc"], invalid=[1])


def test_anchor_and_embedded_id():
    schema = {
        "$id": "https://example.com/root.json",
        "type": "array",
        "items": {"$ref": "item.json"},
        "$defs": {"item": {"$id": "item.json", "$anchor": "it", "type": "integer"}},
    }
    check(schema, valid=[[1, 2]], invalid=[["x"]])
    anchored = {"$ref": "#it", "$defs": {"i": {"$anchor": "it", "type": "null"}}}
    check(anchored, valid=[None], invalid=[0])


# --- arrays -------------------------------------------------------------------------------


def test_items_and_counts():
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    check(schema, valid=[[1], [1, 2, 3]], invalid=[[], [1, 2, 3, 4], ["x"], [1, "x"]])
    check({"type": "array"}, valid=[[], [1, "a", None, [2], {"b": []}]], invalid=[{}])
    check({"type": "array", "items": False}, valid=[[]], invalid=[[1]])


def test_prefix_items_and_draft7_tuples():
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": False,
        "minItems": 1,
    }
    check(schema, valid=[["a"], ["a", 1]], invalid=[[], [1], ["a", 1, 2], ["a", "b"]])
    rest = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "null"}}
    check(rest, valid=[[], ["a"], ["a", None, None]], invalid=[[None], ["a", 1]])
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "boolean"}, {"type": "null"}],
        "additionalItems": {"type": "integer"},
        "minItems": 2,
    }
    check(draft7, valid=[[True, None], [True, None, 5, 6]], invalid=[[True], [True, None, "x"]])


def test_large_max_items_is_capped_and_reported():
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}
    assert any("maxItems 1000" in n for n in notes(schema))
    assert accepts_text(schema, json.dumps(list(range(10))))


# --- composition --------------------------------------------------------------------------


def test_any_of_and_siblings_merged_into_branches():
    schema = {
        "type": "object",
        "required": ["kind"],
        "anyOf": [
            {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}},
            {"properties": {"kind": {"const": "b"}, "y": {"type": "string"}}},
        ],
    }
    check(
        schema,
        valid=[{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}, {"kind": "a"}],
        invalid=[{"x": 1}, {"kind": "a", "x": "s"}, {"kind": "c"}, "s"],
    )


def test_one_of_disjoint_types_and_discriminators():
    check({"oneOf": [{"type": "string"}, {"type": "integer"}]}, valid=["a", 1], invalid=[None])
    tagged = {
        "oneOf": [
            {"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]},
            {"type": "object", "properties": {"t": {"const": 2}}, "required": ["t"]},
        ]
    }
    check(tagged, valid=[{"t": 1}, {"t": 2}], invalid=[{"t": 3}, {}])


def test_one_of_overlapping_scalars_subtracted():
    """integer is inside number: oneOf accepts only non-integral numbers (1.0 is an integer
    for JSON Schema, so it is rejected too)."""
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    check(schema, valid=[1.5, -0.25], invalid=[1, 0, 1.0])
    strings = {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "^a"}]}
    check(strings, valid=["xy", "abcd"], invalid=["ab", 5])


def test_one_of_overlapping_objects_exclude_other_required_keys():
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ]
    }
    check(schema, valid=[{"a": 1}, {"b": 2}, {"a": 1, "c": 0}], invalid=[{"a": 1, "b": 2}, {}])
    assert any("oneOf" in n for n in notes(schema))


def test_one_of_that_cannot_be_separated_errors():
    same = {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"type": "object", "properties": {"b": {"type": "string"}}},
        ]
    }
    with pytest.raises(GrammarError, match="oneOf"):
        schema_to_tree(same)


def test_all_of_merges_objects_and_intersects_strings():
    schema = {
        "$defs": {
            "base": {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            }
        },
        "allOf": [
            {"$ref": "#/$defs/base"},
            {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        ],
    }
    check(schema, valid=[{"id": 1, "name": "x"}], invalid=[{"id": 1}, {"name": "x"}])
    closed = {
        "allOf": [
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            {"properties": {"b": {}}},
        ]
    }
    check(closed, valid=[{}, {"a": 1}], invalid=[{"b": 1}, {"a": 1, "b": 1}])
    strings = {"allOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"maxLength": 3}]}
    check(strings, valid=["abc"], invalid=["abcd", "ab1", ""])
    ranges = {"allOf": [{"minimum": 0}, {"exclusiveMaximum": 10}, {"type": "integer"}]}
    check(ranges, valid=[0, 9], invalid=[-1, 10])


def test_all_of_keeps_an_any_of_branchs_properties_in_place():
    """allOf(A, anyOf(B1, B2), C) generates A's, then the branch's, then C's properties."""
    schema = {
        "allOf": [
            {"type": "object", "properties": {"match": {"type": "string"}}, "required": ["match"]},
            {"anyOf": [{"properties": {"devices": {}}}, {"properties": {"device": {}}}]},
            {"properties": {"engine": {"type": "string"}}},
        ]
    }
    check(
        schema,
        valid=[{"match": "w", "devices": {}, "engine": "b"}, {"match": "w", "device": 1}],
        invalid=[{"devices": {}}, {"match": "w", "engine": 1}],
    )


def test_all_of_merges_a_side_with_pattern_properties():
    """Pattern properties on one side keep applying to the names either side declares."""
    schema = {
        "allOf": [
            {
                "properties": {"name": {"type": "string"}},
                "patternProperties": {"^x-": {"type": "integer"}},
            },
            {"properties": {"bundled": {"type": "array"}, "x-count": {"minimum": 0}}},
        ]
    }
    check(
        schema,
        valid=[{"name": "p", "bundled": ["a"]}, {"bundled": [], "x-count": 2}],
        invalid=[{"x-count": "2"}, {"x-count": -1}, {"name": 1}],
    )


def test_boolean_schemas_and_empty_schema():
    check(True, valid=[1, "a", None, [1], {"a": {"b": 1}}], invalid=[])
    check({}, valid=[[], {}, 0.5], invalid=[])
    with pytest.raises(GrammarError, match="admits no value"):
        schema_to_tree(False)
    check({"type": "object", "properties": {"a": True}}, valid=[{"a": [1]}], invalid=[])
    for depth in (GrammarOptions(any_value_depth=0), GrammarOptions(any_value_depth=1)):
        # below the explicit levels the run-time stack takes over: nesting is unbounded
        assert accepts_text({}, "[[1]]", depth)
        assert accepts_text({}, '{"a": [[{"b": [[[null]]]}]]}', depth)
        assert not accepts_text({}, "[[1]", depth)
        assert not accepts_text({}, "[[1]]]", depth)
        assert not accepts_text({}, "[[1}]", depth)


# --- keywords -----------------------------------------------------------------------------


def test_annotations_and_unknown_keywords_are_ignored():
    schema = {
        "title": "t",
        "description": "d",
        "default": 1,
        "examples": [1],
        "$comment": "c",
        "deprecated": True,
        "readOnly": True,
        "x-vendor": {"anything": 1},
        "type": "integer",
    }
    check(schema, valid=[1], invalid=["1"])


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"not": {"uniqueItems": True}}, "not"),
        ({"not": {"type": "object", "additionalProperties": False}}, "not"),
        ({"if": {"uniqueItems": True}, "then": {"maxItems": 3}}, "if"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"type": "object", "dependentRequired": {k: ["z"] for k in "abcd"}}, "dependencies"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef"),
        ({"type": "integer", "multipleOf": 3}, "multipleOf"),
        ({"type": "string", "format": "color"}, "color"),
        ({"type": "string", "pattern": "(?=a)"}, "lookahead"),
    ],
)
def test_unsupported_keywords_raise_by_name(schema, keyword):
    with pytest.raises(GrammarError, match=keyword.replace("$", r"\$")):
        schema_to_tree(schema)


def test_keywords_of_other_types_do_not_apply():
    schema = {"type": ["string", "integer"], "minLength": 2, "minimum": 5, "uniqueItems": True}
    check(schema, valid=["ab", 5], invalid=["a", 4])
    assert grammar(schema)[0].num_states > 0


# --- negation, conditionals, dependencies, property names ---------------------------------


def test_not_types_enums_and_numbers():
    check({"not": {"type": "string"}}, valid=[1, None, [], {}], invalid=["a"])
    check({"type": ["string", "integer"], "not": {"type": "integer"}}, valid=["a"], invalid=[1])
    check({"type": "string", "not": {"enum": ["a", "b"]}}, valid=["c", ""], invalid=["a", "b"])
    check({"type": "integer", "not": {"multipleOf": 5}}, valid=[1, 7], invalid=[0, 10, -5])
    check({"type": "number", "not": {"type": "integer"}}, valid=[1.5], invalid=[1, 2.0])
    check({"type": "string", "not": {"pattern": "^x"}}, valid=["ax", ""], invalid=["xa"])
    check({"not": False}, valid=[1, "a"], invalid=[])
    with pytest.raises(GrammarError, match="admits no value"):
        schema_to_tree({"not": {}})


def test_not_on_objects_rewritten_as_object_schemas():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "not": {"required": ["a", "b"]},
    }
    check(schema, valid=[{}, {"a": 1}, {"b": 2}], invalid=[{"a": 1, "b": 2}])
    exclusive = {
        "type": "object",
        "properties": {"a": {}, "b": {}, "c": {}},
        "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    }
    check(exclusive, valid=[{}, {"c": 1}], invalid=[{"a": 1}, {"b": 1}])
    value = {"type": "object", "not": {"properties": {"kind": {"const": "x"}}}}
    check(value, valid=[{"kind": "y"}, {"kind": 1, "z": 0}], invalid=[{"kind": "x"}, {}, "s"])


def test_if_then_else():
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "a"}}},
        "then": {"required": ["n"]},
        "else": {"not": {"required": ["n"]}},
    }
    check(
        schema,
        valid=[{"kind": "a", "n": 1}, {"kind": "b"}],
        invalid=[{"kind": "a"}, {"kind": "b", "n": 1}],
    )
    numbers = {"type": "integer", "if": {"minimum": 10}, "then": {"multipleOf": 10}}
    check(numbers, valid=[3, 10, 20], invalid=[11])


def test_dependencies():
    schema = {
        "type": "object",
        "properties": {"card": {"type": "string"}, "billing": {"type": "string"}},
        "dependentRequired": {"card": ["billing"]},
    }
    check(
        schema, valid=[{}, {"billing": "x"}, {"card": "1", "billing": "x"}], invalid=[{"card": "1"}]
    )
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "dependencies": {"a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}},
    }
    check(draft7, valid=[{}, {"a": 1, "b": "x"}], invalid=[{"a": 1}, {"a": 1, "b": 2}])


def test_property_names():
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "integer"}, "TOO_LONG": {"type": "integer"}},
        "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 4},
    }
    check(
        schema, valid=[{"ok": 1}, {"ok": 1, "abc": None}], invalid=[{"TOO_LONG": 1}, {"abcde": 1}]
    )
    enum_names = {"type": "object", "propertyNames": {"enum": ["x", "y"]}}
    check(enum_names, valid=[{}, {"x": 1, "y": 2}], invalid=[{"z": 1}])


def test_one_of_separated_inside_a_shared_required_property():
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"content": {"type": "object", "required": ["image"]}},
                "required": ["content"],
            },
            {
                "type": "object",
                "properties": {"content": {"type": "object", "required": ["src", "alt"]}},
                "required": ["content"],
            },
        ]
    }
    check(
        schema,
        valid=[{"content": {"image": 1}}, {"content": {"src": "a", "alt": "b"}}],
        invalid=[{"content": {"image": 1, "src": "a", "alt": "b"}}, {"content": {}}],
    )


def test_one_of_separated_from_a_closed_branch():
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"a": {}, "b": {}}},
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
        ]
    }
    # {"a": 1} and {} match both branches; {"b": 1} only the first
    check(schema, valid=[{"b": 1}, {"a": 1, "b": 2}], invalid=[{}, {"a": 1}])


def test_one_of_nested_enums_subtracted():
    schema = {
        "type": "string",
        "oneOf": [{"enum": ["a", "b"]}, {"oneOf": [{"enum": ["b", "c"]}, {"pattern": "^d"}]}],
    }
    check(schema, valid=["a", "c", "dx"], invalid=["b", "x"])


def test_not_of_counts_double_negation_and_empty_items():
    check({"not": {"minItems": 2}}, valid=[[], [1]], invalid=[[1, 2], "a", 3])
    check({"not": {"maxLength": 2, "minLength": 1}}, valid=["", "abc"], invalid=["ab", 1])
    check({"not": {"not": {"type": "string"}}}, valid=["a"], invalid=[1])
    check({"type": "array", "not": {"items": False}}, valid=[[1]], invalid=[[]])


def test_not_of_keywords_for_one_type_keeps_only_that_type():
    check({"not": {"multipleOf": 20}}, valid=[3, 2.5], invalid=[40, "a", None, [], {}])
    check({"not": {"minLength": 2}}, valid=["a", ""], invalid=["ab", 1])


def test_one_of_discriminated_by_patterns_and_nested_composition():
    modules = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"type": {"type": "string", "pattern": f"^{name}$"}, "x": {}},
                "required": ["type"],
                "additionalProperties": False,
            }
            for name in ("Abs", "Add", "Avg")
        ]
    }
    check(modules, valid=[{"type": "Add"}, {"type": "Avg", "x": 1}], invalid=[{"type": "Sub"}])
    address = {
        "oneOf": [
            {"type": ["string", "null"], "minLength": 2},
            {"type": "object", "anyOf": [{"required": ["street"]}, {"required": ["zip"]}]},
        ]
    }
    check(address, valid=["ab", None, {"zip": 1}], invalid=["a", {}, 3])


def test_one_of_branch_inside_another_and_disjoint_property_values():
    volume = {
        "type": "object",
        "properties": {"length": {}, "radius": {}, "height": {}},
        "oneOf": [
            {"required": ["length"]},
            {"required": ["radius"]},
            {"required": ["radius", "height"]},
        ],
    }
    # the third branch implies the second: an object with radius and height matches both
    check(volume, valid=[{"length": 1}, {"radius": 1}], invalid=[{"radius": 1, "height": 2}, {}])
    events = {
        "type": "object",
        "oneOf": [
            {"properties": {"events": {"type": "array"}}},
            {"properties": {"events": {"enum": ["all", "added"]}}},
        ],
    }
    check(events, valid=[{"events": []}, {"events": "all"}], invalid=[{}, {"events": 1}])


def test_one_of_with_a_branch_that_only_constrains_strings():
    """{"pattern": ...} accepts every non-string, so those match both branches."""
    schema = {"oneOf": [{"type": ["string", "array", "null"]}, {"pattern": "^[0-9]+$"}]}
    check(schema, valid=["abc", 5, {}], invalid=["123", [], None])


@pytest.mark.parametrize(
    "schema",
    [
        [],
        5,
        {"type": 5},
        {"type": ["string", 5]},
        {"properties": []},
        {"properties": {"a": "string"}},
        {"required": "a"},
        {"enum": 5},
        {"not": 5},
        {"oneOf": [5]},
        {"allOf": []},
        {"items": 5},
        {"minLength": -1},
        {"maxItems": 1.5},
        {"pattern": 5},
        {"minimum": "a"},
        {"multipleOf": 0},
        {"$ref": 5},
        {"dependentRequired": {"a": "b"}},
    ],
)
def test_malformed_schemas_raise_grammar_errors(schema):
    with pytest.raises(GrammarError):
        schema_to_tree(schema)
