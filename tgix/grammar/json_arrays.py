"""Array schemas: `prefixItems` + `items` (2020-12), array-form `items` + `additionalItems`
(draft 4-2019), `minItems` / `maxItems`.

Element i (0-based) follows the i-th tuple schema while there is one, then the schema for the
remaining items (absent = any value, `false` = none). Counts are enforced exactly: the tuple
part is a right-nested chain of optional `, item` steps that become mandatory below
`minItems`, the rest a bounded repetition. `maxItems` above `ITEMS_CAP` is generated as at most
`ITEMS_CAP` items (reported): each allowed position costs a copy of the item automaton.
"""

from __future__ import annotations

from collections.abc import Callable

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import NEVER, Context, cat, optional, repeat
from tgix.grammar.json_strings import count_keyword
from tgix.grammar.regex_tree import Node

Compile = Callable[[object], Node]

ITEMS_CAP = 64


def array_node(schema: dict, ctx: Context, compile_: Compile) -> Node:
    """The JSON text of the arrays the schema's array keywords allow."""
    items = schema.get("items")
    if "prefixItems" in schema:
        tuple_schemas = schema["prefixItems"]
        rest = True if items is None else items
    elif isinstance(items, list):
        tuple_schemas = items
        rest = schema.get("additionalItems", True)
    else:
        tuple_schemas = []
        rest = True if items is None else items
    if not isinstance(tuple_schemas, list):
        raise GrammarError("JSON Schema keyword 'prefixItems' must be an array")
    lo = count_keyword(schema, "minItems") or 0
    hi = count_keyword(schema, "maxItems")
    if hi is not None and hi < lo:
        return NEVER
    positions = [compile_(s) for s in tuple_schemas]
    rest_node = compile_(rest)
    if hi is not None and hi > ITEMS_CAP and rest_node != NEVER and hi > len(positions):
        capped = max(ITEMS_CAP, lo, len(positions))
        if capped < hi:
            ctx.approximate(f"maxItems {hi} generated as at most {capped} items")
            hi = capped
    if hi is not None:
        positions = positions[:hi]
    layout = ctx.layout
    # tail(i): the elements from index i on, given that i elements came before (i >= 1).
    k = len(positions)
    remaining_lo = max(lo - k, 0)
    remaining_hi = None if hi is None else hi - k
    tail = repeat(cat(layout.comma, rest_node), remaining_lo, remaining_hi)
    if k == 0:
        first = cat(rest_node, repeat(cat(layout.comma, rest_node), max(lo - 1, 0), _dec(hi)))
        return layout.container("[", "]", first, lo == 0)
    for i in range(k - 1, 0, -1):
        step = cat(layout.comma, positions[i], tail)
        tail = step if i < lo else optional(step)
    return layout.container("[", "]", cat(positions[0], tail), lo == 0)


def _dec(hi: int | None) -> int | None:
    return None if hi is None else hi - 1
