"""`oneOf`: exactly one branch. Branches that are provably disjoint (json_compose.disjoint,
with exact scalar grammars probed for an empty intersection) are plain alternatives. An
object branch overlapping another is narrowed so that the other cannot match it: a name the
other requires is forbidden, possibly inside a shared required property; a name whose values
the two keep disjoint is required; a name the other, closed, branch does not declare is
required; a branch inside another (it requires all the other requires) is dropped. These are
documented subsets, reported in the notes. Other overlaps are subtracted
(json_logic.subtract); anything else raises `GrammarError`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import NEVER, both, prune_empty, union
from tgix.grammar.json_compose import disjoint
from tgix.grammar.json_keywords import OBJECT_KEYWORDS, asserts, type_set
from tgix.grammar.json_logic import brief, flat_schema, subtract, unsupported
from tgix.grammar.regex_tree import Node

if TYPE_CHECKING:
    from tgix.grammar.json_schema import Converter


def _object_only(schema: object) -> bool:
    """Only object keywords: every non-object value satisfies the schema."""
    if not isinstance(schema, dict) or not asserts(schema):
        return False
    return all(k in OBJECT_KEYWORDS or not asserts({k: v}) for k, v in schema.items())


def compile_one_of(conv: Converter, rest: dict, branches: list) -> Node:
    alone = [flat_schema(conv, b) for b in branches]
    if len(branches) > 1 and all(_object_only(b) for b in alone):
        # a non-object satisfies every branch, so more than one: only objects qualify
        branches = [{"allOf": [b, {"type": "object"}]} for b in branches]
    flat = [flat_schema(conv, {"allOf": [rest, b]}) for b in branches]
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
            pair = f"{brief(flat[i])} / {brief(flat[j])}"
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
        sub_mine = flat_schema(conv, props.get(name, True))
        sub_theirs = flat_schema(conv, theirs.get("properties", {}).get(name, True))
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
