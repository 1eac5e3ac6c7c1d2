"""JSON Schema to a regex tree matching exactly the JSON text the schema allows (modulo the
documented approximations, each reported in the notes), for constrained decoding.

Entry point: `schema_to_tree(schema, options) -> (node, notes)`.

Dispatch on a schema object:
1. `true` / `{}` (nothing asserted): any JSON value at any depth (json_any: explicit levels,
   then a run-time stack); `false`: nothing. `$dynamicRef` / `$recursiveRef` raise.
2. `$ref` (json_refs: local JSON pointers, `#`, `$anchor`, embedded `$id`s): compiled once
   per target and reused; a target already being expanded `max_recursion_depth` times is cut
   (its branch disappears, reported in the notes; an error if nothing finite is left).
   Keywords next to `$ref` are intersected (2019-09+) or ignored (draft 4-7, as those drafts
   specify).
3. `allOf` (with sibling keywords): merged into one schema (json_compose), leftovers
   intersected with `Both`.
4. `not`, `if`/`then`/`else`, dependencies (json_logic), `oneOf` (json_oneof); `anyOf`:
   sibling keywords merged into every branch, then alternation.
5. Otherwise `type` (all types when absent) chooses the branches; each type's keywords apply
   only to it (json_strings, json_numbers, json_objects, json_arrays); `enum` / `const`
   values are rendered as exact JSON text and intersected with the other keywords when any
   apply.
Annotations (title, description, default, examples, $comment, ...) and unknown keywords
(vendor extensions) are ignored, as JSON Schema specifies; assertions that are not supported
raise `GrammarError` naming the keyword.
"""

from __future__ import annotations

import time

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_any import any_value_tree
from tgix.grammar.json_arrays import array_node
from tgix.grammar.json_common import (
    NEVER,
    Context,
    atomic,
    both,
    json_type,
    prune_empty,
    union,
)
from tgix.grammar.json_common import value_literal as _value_literal
from tgix.grammar.json_compose import Merger, distribute_any_of
from tgix.grammar.json_keywords import (
    KEYWORDS_BY_TYPE,
    asserts,
    check_shape,
    declared_types,
    enum_values,
    numeric_bounds,
    to_decimal,
)
from tgix.grammar.json_logic import (
    compile_if,
    compile_not,
    dependency_variants,
    unsupported,
)
from tgix.grammar.json_numbers import (
    CANONICAL_INTEGER,
    CANONICAL_NUMBER,
    INTEGER,
    NUMBER,
    integer_bounds,
    integer_range,
    multiple_of,
    number_range,
)
from tgix.grammar.json_objects import object_node
from tgix.grammar.json_oneof import compile_one_of
from tgix.grammar.json_refs import Resolver
from tgix.grammar.json_strings import as_tuple, string_node
from tgix.grammar.nfa import check_deadline
from tgix.grammar.options import GrammarOptions
from tgix.grammar.regex_tree import Node, Regex, literal

_DRAFTS = (("draft-03", 3), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7))
_DRAFTS += (("2019-09", 2019), ("2020-12", 2020))
_DEFAULT_OPTIONS = GrammarOptions()


def schema_to_tree(
    schema: dict | bool, options: GrammarOptions = _DEFAULT_OPTIONS
) -> tuple[Node, list[str]]:
    """Returns the regex tree (tgix.grammar.regex_tree nodes) matching exactly the JSON text
    the grammar allows, and a list of human-readable notes (e.g. 'recursive $ref
    #/$defs/node unrolled to depth 3'). Raises GrammarError naming an unsupported keyword."""
    return Converter(schema, options).run()


class Converter:
    """One conversion: the resolver, the merger, the recursion state and the memo of compiled
    `$ref` targets. `canonical` is set while compiling the two sides of a subtraction."""

    def __init__(self, root: object, options: GrammarOptions):
        if not isinstance(root, dict | bool):
            raise GrammarError("a JSON Schema must be an object or a boolean")
        self.root = root
        self.options = options
        # Mutually recursive $refs are recompiled at every unrolled depth: bounded by the
        # compile's time budget here too (a lazy compile runs in a thread, no SIGALRM).
        self.deadline = time.monotonic() + options.timeout_s
        self.ctx = Context(options)
        marker = root.get("$schema", "") if isinstance(root, dict) else ""
        marker = marker if isinstance(marker, str) else ""
        self.draft = next((d for m, d in _DRAFTS if m in marker), 2020)
        self.resolve = Resolver(root)
        self.merger = Merger(self.resolve, ignore_ref_siblings=self.draft <= 7)
        self.active: dict[int, int] = {id(root): 1}
        self.cut_refs: list[str] = []
        self.memo: dict[tuple, tuple[Node, int]] = {}
        self.canonical = False

    def run(self) -> tuple[Node, list[str]]:
        node = self.compile(self.root)
        if node == NEVER:
            if self.cut_refs:
                raise GrammarError(
                    f"recursive $ref {self.cut_refs[0]} has no finite alternative within "
                    f"max_recursion_depth={self.options.max_recursion_depth}"
                )
            raise GrammarError("the JSON Schema admits no value")
        return node, list(self.ctx.notes)

    def compile_ref(self, ref: object) -> Node:
        """A `$ref` target, compiled once (unless a recursion cut happened inside) and cut
        where it is already being expanded max_recursion_depth times."""
        target = self.resolve(ref)
        key = (id(target), self.canonical)
        if key in self.memo:
            node, approximations = self.memo[key]
            self.ctx.approximations += approximations
            return node
        depth = self.active.get(id(target), 0)
        if depth >= self.options.max_recursion_depth:
            self.cut_refs.append(str(ref))
            self.ctx.approximate(
                f"recursive $ref {ref} unrolled to depth {self.options.max_recursion_depth}"
            )
            return NEVER
        cuts, approximations = len(self.cut_refs), self.ctx.approximations
        self.active[id(target)] = depth + 1
        try:
            node = self.compile(target)
        finally:
            self.active[id(target)] = depth
        if len(self.cut_refs) == cuts:
            self.memo[key] = (node, self.ctx.approximations - approximations)
        return node

    # --- composition --------------------------------------------------------------------

    def compile(self, schema: object) -> Node:
        check_deadline(self.deadline)
        if schema is True:
            return self.any_value()
        if schema is False:
            return NEVER
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON Schema must be an object or a boolean, got {schema!r}")
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in schema:
                raise unsupported(keyword)
        check_shape(schema)
        if not asserts(schema):
            return self.any_value()

        def rest(*names: str) -> dict:
            return {k: v for k, v in schema.items() if k not in names}

        if "$ref" in schema:
            if self.draft <= 7 or not asserts(rest("$ref")):
                return self.compile_ref(schema["$ref"])
            return self.compile_all([{"$ref": schema["$ref"]}, rest("$ref")])
        for keyword in ("allOf", "anyOf", "oneOf"):
            if keyword in schema and (not isinstance(schema[keyword], list) or not schema[keyword]):
                raise GrammarError(f"JSON Schema keyword {keyword!r} must be a non-empty array")
        if "allOf" in schema:
            return self.compile_all([*schema["allOf"], rest("allOf")])
        if "not" in schema:
            return compile_not(self, rest("not"), schema["not"])
        if "if" in schema:
            return compile_if(self, rest("if", "then", "else"), schema)
        names = ("dependencies", "dependentRequired", "dependentSchemas")
        variants = dependency_variants(schema)
        if variants is not None:
            return union(*(self.compile_all([rest(*names), *v]) for v in variants))
        if "anyOf" in schema:
            return union(*(self.compile_all([rest("anyOf"), b]) for b in schema["anyOf"]))
        if "oneOf" in schema:
            return compile_one_of(self, rest("oneOf"), schema["oneOf"])
        return self.compile_plain(schema)

    def compile_all(self, parts: list) -> Node:
        """The conjunction of schemas: merged where possible, the rest intersected."""
        parts = [p for p in parts if asserts(p)]
        if len(parts) <= 1:
            return self.compile(parts[0] if parts else True)
        distributed = distribute_any_of(parts)
        if distributed is not None:
            return union(*(self.compile_all(p) for p in distributed))
        merged, residual = self.merger.merge_all(parts)
        inlined = [self.resolve(r) for r in self.merger.take_inlined()]
        for target in inlined:
            if self.active.get(id(target), 0) >= self.options.max_recursion_depth:
                self.cut_refs.append("(allOf)")
                self.ctx.approximate("recursive allOf / $ref merge cut")
                return NEVER
        for target in inlined:
            self.active[id(target)] = self.active.get(id(target), 0) + 1
        try:
            return prune_empty(both(self.compile(merged), *(self.compile(r) for r in residual)))
        finally:
            for target in inlined:
                self.active[id(target)] -= 1

    # --- types ------------------------------------------------------------------------

    def compile_plain(self, schema: dict) -> Node:
        types = declared_types(schema)
        unknown = types - set(KEYWORDS_BY_TYPE)
        if unknown:
            raise GrammarError(f"unknown JSON Schema type {sorted(unknown)[0]!r}")
        values = enum_values(schema)
        if values is not None:
            return self.compile_enum(schema, types, values)
        branches = []
        if "number" in types or "integer" in types:
            branches.append(self.number(schema, integer="number" not in types))
        if "string" in types:
            branches.append(string_node(schema, self.ctx, self.canonical))
        if "boolean" in types:
            branches.append(union(literal("true"), literal("false")))
        if "null" in types:
            branches.append(literal("null"))
        if "array" in types:
            branches.append(self.array(schema))
        if "object" in types:
            branches.append(self.object(schema))
        return union(*branches)

    def compile_enum(self, schema: dict, types: frozenset, values: list) -> Node:
        values = [v for v in values if json_type(v) in types]
        value_types = {json_type(v) for v in values}
        layout = self.ctx.layout
        node = union(*(_value_literal(v, layout, self.canonical) for v in values))
        relevant = set().union(*(KEYWORDS_BY_TYPE[t] for t in value_types))
        rest = {k: v for k, v in schema.items() if k in relevant}
        if not rest or node == NEVER:
            return node
        rest["type"] = sorted(value_types)
        return prune_empty(both(node, self.compile_plain(rest)))

    def number(self, schema: dict, integer: bool) -> Node:
        """Integers or numbers within the bounds and multiples; bounded ones (and all in
        canonical mode) without an exponent. Integers may end in `.0` (JSON Schema: a number
        with a zero fraction is an integer) except in canonical mode."""
        lo, lo_strict, hi, hi_strict = numeric_bounds(schema)
        parts: list[Node] = []
        if lo is not None or hi is not None:
            if integer:
                text = integer_range(*integer_bounds(lo, lo_strict, hi, hi_strict))
            else:
                text = number_range(lo, lo_strict, hi, hi_strict)
            if text is None:
                return NEVER
            parts.append(Regex(text))
        for k in as_tuple(schema.get("multipleOf")):
            k = to_decimal(k, "multipleOf")
            if not (integer and k == 1):
                parts.append(Regex(multiple_of(k, integer)))
        if parts and not integer and not self.canonical:
            self.ctx.approximate("bounded numbers are generated without an exponent")
        if self.canonical or not parts:
            if integer:
                parts.append(Regex(CANONICAL_INTEGER if self.canonical else INTEGER))
            else:
                parts.append(Regex(CANONICAL_NUMBER if self.canonical else NUMBER))
        # `integer` is integer literals only: JSON Schema also counts 1.0 as an integer, but a
        # model offered `.0+` writes 11.0000... until its token limit
        return prune_empty(both(*parts))

    def array(self, schema: dict) -> Node:
        if "unevaluatedItems" in schema and "items" not in schema:
            schema = {**schema, "items": schema["unevaluatedItems"]}
        if "contains" in schema:
            raise unsupported("contains")
        if schema.get("uniqueItems") is True and (schema.get("maxItems") or 2) > 1:
            raise unsupported("uniqueItems")
        return array_node(schema, self.ctx, self.compile)

    def object(self, schema: dict) -> Node:
        if "unevaluatedProperties" in schema and "additionalProperties" not in schema:
            schema = {**schema, "additionalProperties": schema["unevaluatedProperties"]}
        names = None
        if asserts(schema.get("propertyNames", True)):
            saved, self.canonical = self.canonical, True  # keys are canonical strings
            try:
                names = self.compile_all([schema["propertyNames"], {"type": "string"}])
            finally:
                self.canonical = saved
        return atomic(object_node(schema, self.ctx, self.compile, names))

    def any_value(self) -> Node:
        key = ("any", self.canonical)
        if key in self.memo:
            self.ctx.approximations += 1
            return self.memo[key][0]
        value = any_value_tree(self.ctx, self.canonical)
        self.memo[key] = (value, 1)
        return value
