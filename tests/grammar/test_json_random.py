"""Randomized agreement with `jsonschema`: instances drawn from pools of valid and invalid
values, keys in the grammar's order, both layouts; the grammar must accept exactly the valid
ones."""

from __future__ import annotations

import random

import pytest

from tests.grammar.json_helpers import accepts_text, is_valid, texts

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 500},
        "name": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "score": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "kind": {"oneOf": [{"const": "x"}, {"type": "integer"}, {"type": "number"}]},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["id", "name"],
    "additionalProperties": {"type": "boolean"},
}
# (mostly valid values, mostly invalid values) per property; jsonschema decides
POOLS = {
    "id": ([1, 250, 500, 1.0], [0, 501, -3, "1", None]),
    "name": (["a", "abc", "abcdefgh"], ["abcdefghi", "", "A", "a1", 'a"']),
    "tags": ([[], ["a"], ["a", "b", "c"]], [["a", "b", "c", "a"], ["d"], "a", [None]]),
    "score": ([None, 0.5, 1, 0.001, 1.0], [0, 1.5, "x", -0.25]),
    "kind": (["x", 3, 3.5, -0.5], ["y", None, 2.0]),
    "when": (["2024-02-29", "1999-12-31"], ["2023-02-29", "2024-13-01", 20240229]),
}
EXTRAS = {"z": [True, 1, None], "id2": [False, "f"], "é": [True]}


def _instance(rng: random.Random) -> dict:
    value = {}
    for name, (good, bad) in POOLS.items():
        if name in ("id", "name") or rng.random() < 0.5:
            value[name] = rng.choice(good if rng.random() < 0.9 else bad)
    for name, pool in EXTRAS.items():
        if rng.random() < 0.15:
            value[name] = rng.choice(pool)
    return value


@pytest.mark.parametrize("seed", range(4))
def test_random_instances_agree_with_jsonschema(seed):
    rng = random.Random(seed)
    counts = {True: 0, False: 0}
    for _ in range(150):
        value = _instance(rng)
        expected = is_valid(SCHEMA, value)
        counts[expected] += 1
        for text in texts(value):
            assert accepts_text(SCHEMA, text) is expected, text
    assert counts[True] > 5 and counts[False] > 5  # both kinds were exercised
