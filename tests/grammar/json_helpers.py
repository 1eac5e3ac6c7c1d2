"""Helpers for the JSON Schema converter tests: compile a schema to the byte DFA once, and
check instances against both the grammar and the `jsonschema` validator."""

from __future__ import annotations

import functools
import json

import jsonschema

from tgix.grammar import pushdown
from tgix.grammar.automaton import build_dfa
from tgix.grammar.json_schema import schema_to_tree
from tgix.grammar.options import GrammarOptions

DEFAULT = GrammarOptions()
LAYOUTS = ((", ", ": "), (",", ":"))


@functools.lru_cache(maxsize=256)
def _compiled(schema_json: str, options: GrammarOptions):
    tree, notes = schema_to_tree(json.loads(schema_json), options)
    return build_dfa(tree, options.max_states), notes


def grammar(schema, options: GrammarOptions = DEFAULT):
    """(ByteDFA, notes) for a schema; cached, key order preserved."""
    return _compiled(json.dumps(schema), options)


def notes(schema, options: GrammarOptions = DEFAULT) -> list[str]:
    return grammar(schema, options)[1]


def accepts_text(schema, text: str, options: GrammarOptions = DEFAULT) -> bool:
    """Through the run-time stack (tgix.grammar.pushdown) when the grammar has one."""
    dfa = grammar(schema, options)[0]
    if not pushdown.has_nesting(dfa):
        return dfa.accepts(text.encode())
    real, nesting = pushdown.combine(dfa, options)
    return pushdown.accepts(real, nesting, text.encode())


def texts(value) -> list[str]:
    """`value` as json.dumps writes it, default and compact separators."""
    return [json.dumps(value, ensure_ascii=False, separators=s) for s in LAYOUTS]


def _integer_literal(checker, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_valid(schema, value) -> bool:
    """What the grammar must accept: valid for jsonschema, and still valid when `integer`
    means an integer literal only (JSON Schema also counts 2.0, which tgix does not
    generate). The conjunction keeps the oracle a subset of both readings, so wherever
    JSON Schema rejects 2.0 (`oneOf` of integer and number, `not` integer) so must tgix."""
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    literal = jsonschema.validators.extend(
        base, type_checker=base.TYPE_CHECKER.redefine("integer", _integer_literal)
    )
    return all(
        cls(schema, format_checker=base.FORMAT_CHECKER).is_valid(value) for cls in (base, literal)
    )


def check(schema, valid=(), invalid=(), options: GrammarOptions = DEFAULT) -> None:
    """Each valid instance is valid for jsonschema and accepted in both layouts; each invalid
    one is invalid for jsonschema and rejected in both layouts (keys in schema order)."""
    for value in valid:
        assert is_valid(schema, value), f"test bug: {value!r} is invalid for jsonschema"
        for text in texts(value):
            assert accepts_text(schema, text, options), f"valid instance rejected: {text}"
    for value in invalid:
        assert not is_valid(schema, value), f"test bug: {value!r} is valid for jsonschema"
        for text in texts(value):
            assert not accepts_text(schema, text, options), f"invalid instance accepted: {text}"
