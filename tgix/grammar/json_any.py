"""Unconstrained JSON values (`{}`, `true`, open `additionalProperties`) as regex trees.

The first `options.any_value_depth` container levels are spelled out in the automaton (their
masks are precomputed: the fast path). One level further down, a value that opens a container
is the raw marker byte NESTED, which `tgix.grammar.pushdown` replaces at run time by a stack
over `container_tree` (one array or object whose values are scalars or NESTED again), so an
instance nests as deep as it likes while the automaton stays the size of two levels.

In canonical mode (both sides of a subtraction, see json_oneof / json_logic) the marker is left
out and nesting stops at the explicit levels: a difference must not subtract "some container"
as a symbol. That bound is an approximation and is reported as one.
"""

from __future__ import annotations

from tgix.grammar.json_common import Context, Layout, atomic, literal, union
from tgix.grammar.json_numbers import CANONICAL_NUMBER, NUMBER
from tgix.grammar.json_objects import KEY
from tgix.grammar.json_strings import string_node
from tgix.grammar.options import GrammarOptions
from tgix.grammar.regex_tree import Node, RawByte, Regex

NESTED = 0xFF  # never a byte of UTF-8 text


def _scalars(ctx: Context, canonical: bool) -> Node:
    return union(
        string_node({}, ctx, canonical),
        Regex(CANONICAL_NUMBER if canonical else NUMBER),
        literal("true"),
        literal("false"),
        literal("null"),
    )


def _containers(layout: Layout, value: Node) -> tuple[Node, Node]:
    """(array, object) whose items / member values are `value`."""
    array = layout.container("[", "]", layout.separated(value, value, 0, None), True)
    member = layout.member(KEY, value)
    obj = layout.container("{", "}", layout.separated(member, member, 0, None), True)
    return array, obj


def any_value_tree(ctx: Context, canonical: bool) -> Node:
    """Any JSON value: `any_value_depth` explicit container levels, then the NESTED marker
    (or, canonical, nothing deeper)."""
    depth = ctx.options.any_value_depth
    scalars = _scalars(ctx, canonical)
    if canonical:
        ctx.approximate(f"unconstrained values nest at most {depth} levels deep here")
        value = scalars
    else:
        ctx.approximations += 1  # exact, but a subtraction must not see the marker
        value = union(scalars, RawByte(NESTED))
    for _ in range(depth):
        value = atomic(union(scalars, *_containers(ctx.layout, value)))
    return value


def container_tree(options: GrammarOptions) -> Node:
    """One array or object (brackets included) whose values are scalars or NESTED: the
    automaton the run-time stack re-enters at every deeper level."""
    ctx = Context(options)
    value = union(_scalars(ctx, False), RawByte(NESTED))
    return union(*_containers(ctx.layout, value))
