"""Numbers: exact integer and decimal ranges (compared with `jsonschema` over many values),
draft-4 boolean exclusive bounds, `multipleOf`."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import pytest

from tests.grammar.json_helpers import accepts_text, check, is_valid
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_numbers import integer_range, multiple_of, number_range
from tgix.grammar.json_schema import schema_to_tree

INTEGERS = [str(i) for i in range(-1100, 1100)] + ["-0", "123456789012", "-99999999999"]
rng = random.Random(0)
DECIMALS = sorted(
    {
        rng.choice(["", "-"])
        + rng.choice(["0", "1", "2", "9", "10", "42", "99", "100", "101", "1000"])
        + rng.choice(["", ".0", ".5", ".05", ".25", ".125", ".999", ".1", ".10", ".0001"])
        for _ in range(3000)
    }
)


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(None, None), (0, None), (None, 0), (5, 17), (-17, -5), (-3, 250), (99, 1001), (7, 7)],
)
def test_integer_range_regex_is_exact(lo, hi):
    regex = re.compile(integer_range(lo, hi))
    for text in INTEGERS:
        inside = (lo is None or int(text) >= lo) and (hi is None or int(text) <= hi)
        assert bool(regex.fullmatch(text)) is (inside and text != "-0"), text


def test_empty_integer_range():
    assert integer_range(5, 4) is None


@pytest.mark.parametrize(
    ("lo", "lo_strict", "hi", "hi_strict"),
    [
        ("0.1", False, "0.9", False),
        ("0.1", True, "0.9", True),
        ("0", True, None, False),
        ("-1.5", False, "2.25", True),
        (None, False, "0", False),
        (None, False, "0", True),
        ("0", False, "0", False),
        ("-0.05", False, "0.05", False),
        ("12", False, "100", False),
        ("0.123", True, "0.999", False),
        ("-100", False, "-0.5", True),
        ("9.99", False, None, False),
    ],
)
def test_decimal_range_regex_is_exact(lo, lo_strict, hi, hi_strict):
    lo_d = None if lo is None else Decimal(lo)
    hi_d = None if hi is None else Decimal(hi)
    regex = re.compile(number_range(lo_d, lo_strict, hi_d, hi_strict))
    for text in DECIMALS:
        v = Decimal(text)
        inside = lo_d is None or v > lo_d or (v == lo_d and not lo_strict)
        inside = inside and (hi_d is None or v < hi_d or (v == hi_d and not hi_strict))
        assert bool(regex.fullmatch(text)) is inside, text


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 1, "maximum": 100},
        {"exclusiveMinimum": 0, "exclusiveMaximum": 10},
        {"minimum": -5.5, "maximum": 3.25},
        {"exclusiveMinimum": -1, "maximum": 0},
        {"minimum": 0},
        {"maximum": -2},
    ],
)
@pytest.mark.parametrize("kind", ["integer", "number"])
def test_bounds_agree_with_jsonschema(bounds, kind):
    schema = {"type": kind, **bounds}
    values = [json.loads(t) for t in DECIMALS[::7]] + [int(t) for t in INTEGERS[::13]]
    for value in values:
        expected = is_valid(schema, value)
        assert accepts_text(schema, json.dumps(value)) is expected, (schema, value)


def test_draft4_boolean_exclusive_bounds():
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 10,
        "exclusiveMaximum": True,
    }
    check(schema, valid=[1, 9], invalid=[0, 10])


def test_non_integer_bounds_on_integers():
    check({"type": "integer", "minimum": 0.5, "maximum": 2.5}, valid=[1, 2], invalid=[0, 3])
    with pytest.raises(GrammarError, match="admits no value"):
        schema_to_tree({"type": "integer", "minimum": 1.2, "maximum": 1.8})


def test_bounded_numbers_have_no_exponent():
    schema = {"type": "number", "minimum": 0}
    assert accepts_text(schema, "100.5")
    assert not accepts_text(schema, "1e2")  # valid, but not generated (documented)
    assert accepts_text({"type": "number"}, "1e2")


@pytest.mark.parametrize(
    ("k", "integer"),
    [("1", False), ("2", True), ("5", False), ("0.01", False), ("0.25", False), ("2.5", False)]
    + [("100", True), ("8", True), ("0.5", True)],
)
def test_multiple_of_regex_is_exact(k, integer):
    regex = re.compile(multiple_of(Decimal(k), integer))
    texts = INTEGERS[::3] + ([] if integer else DECIMALS)
    for text in texts:
        expected = Decimal(text) % Decimal(k) == 0
        assert bool(regex.fullmatch(text)) is expected, (k, text)


def test_multiple_of_in_schemas():
    check({"type": "integer", "multipleOf": 5, "maximum": 20}, valid=[0, 15, -5], invalid=[3, 25])
    check({"type": "number", "multipleOf": 0.5}, valid=[1.5, 2, -0.5], invalid=[1.25])
    with pytest.raises(GrammarError, match="multipleOf"):
        schema_to_tree({"type": "integer", "multipleOf": 7})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer"},
        {"type": "integer", "minimum": 0, "maximum": 100},
        {"type": "integer", "multipleOf": 5},
        {"type": ["integer", "null"]},
    ],
)
def test_integers_are_integer_literals_only(schema):
    """A model offered `.0+` writes 11.0000... to its token limit: integers have no fraction,
    no exponent; `number` keeps every JSON spelling, integers included."""
    for text in ["10", "0", "-5" if "minimum" not in schema else "15"]:
        assert accepts_text(schema, text), text
    for text in ["10.0", "11.000", "1e1", "10.", "2.5"]:
        assert not accepts_text(schema, text), text
    if "type" in schema and len(schema) == 1:  # unbounded: every spelling of a number
        number = {"type": ["number", "null"] if isinstance(schema["type"], list) else "number"}
        for text in ["10", "10.0", "11.000", "1e1"]:
            assert accepts_text(number, text), text
