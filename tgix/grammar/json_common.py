"""Building blocks shared by the JSON Schema converter modules.

- `NEVER`, the empty language, and node constructors (`cat`, `union`, `optional`, `repeat`,
  `both`, `minus`) that propagate it: a `false` subschema, an empty enum or a recursion cut
  makes its branch disappear instead of leaving an impossible leaf in the tree, and a schema
  whose whole language is empty is reported as an error by the caller.
- `Layout`: JSON punctuation with the whitespace policy (whitespace only after `{ [ , :` and
  before `} ]`).
- `value_literal`: any JSON value as the exact text a grammar allows for `const` / `enum`.
- `STRING_UNIT` / `CANONICAL_UNIT`: one code point of JSON string content, in any JSON
  spelling or in the single spelling `json.dumps(..., ensure_ascii=False)` produces.
- `prune_empty` (an intersection or difference that may be empty becomes NEVER) and `atomic`
  (a piece the automaton should minimise on its own).
- `Context`: options, notes and the count of approximations of one conversion.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_numbers import canonical_number_text
from tgix.grammar.options import GrammarOptions
from tgix.grammar.regex_tree import (
    Alt,
    Both,
    Minus,
    Node,
    RawByte,
    Regex,
    Repeat,
    alt,
    literal,
    seq,
)

NEVER = Regex("[]")  # the empty language (interegular's empty class); pruned by the constructors
EMPTY = Regex("")

# One code point of string content as JSON text: an unescaped character, a short escape, a
# `\uXXXX` escape of a non-surrogate or a surrogate pair (lone surrogates are not accepted).
STRING_UNIT = (
    r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}'
    r"|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))"
)
# The same code points, each in its one canonical spelling (json.dumps, ensure_ascii=False):
# one text per string, so text equality is value equality (needed for `Minus` on keys).
CANONICAL_UNIT = r'(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))'
# Canonical escapes of the characters that cannot appear raw in a JSON string.
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n"}
_SHORT_ESCAPES.update({"\r": "\\r", "\t": "\\t"})


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')  # what json_escape_char changes


def json_escape_char(ch: str) -> str:
    """The canonical JSON text of one character inside a string."""
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    if ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF:
        return f"\\u{ord(ch):04x}"
    return ch


def json_string_text(value: str) -> str:
    """`json.dumps(value, ensure_ascii=False)`, with lone surrogates escaped (they cannot be
    written as UTF-8)."""
    if not _NEEDS_ESCAPE.search(value):
        return '"' + value + '"'
    return '"' + "".join(json_escape_char(c) for c in value) + '"'


def _is_never(node: Node) -> bool:
    return type(node) is Regex and node.source == NEVER.source


def cat(*parts: Node) -> Node:
    if any(map(_is_never, parts)):
        return NEVER
    return seq(*parts)


def union(*options: Node) -> Node:
    flat: list[Node] = []
    for o in options:
        if _is_never(o):
            continue
        flat.extend(o.options if isinstance(o, Alt) else (o,))
    return NEVER if not flat else alt(*flat)


def optional(node: Node) -> Node:
    if node in (NEVER, EMPTY):
        return EMPTY
    return Repeat(node, 0, 1)


def repeat(node: Node, lo: int, hi: int | None) -> Node:
    if hi is not None and hi < lo:
        return NEVER
    if hi == 0:
        return EMPTY
    if node == NEVER:
        return EMPTY if lo == 0 else NEVER
    if node == EMPTY:
        return EMPTY
    if lo == hi == 1:
        return node
    return Repeat(node, lo, hi)


def both(*parts: Node) -> Node:
    if any(p == NEVER for p in parts):
        return NEVER
    unique = list(dict.fromkeys(parts))
    return unique[0] if len(unique) == 1 else Both(tuple(unique))


def atomic(node: Node) -> Node:
    """The same language as a one-part intersection, which the automaton builds as a minimal
    DFA of its own before embedding it. Used for any-value grammars and objects: the
    enclosing determinisation then starts from their minimal form instead of their NFA
    (lists like `x (, x)*` hold two NFA copies of x, doubling the subset states at every
    nesting level; on MaskBench this turns most "grammar too large" schemas, whose minimal
    DFAs have a few thousand states, into compiled ones)."""
    if node in (NEVER, EMPTY) or isinstance(node, Regex | RawByte | Both | Minus):
        return node
    return Both((node,))


def prune_empty(node: Node, budget: int = 4000) -> Node:
    """NEVER if the node's language is empty, else the node. Intersections and differences
    can be empty (a pattern longer than maxLength, an enum none of whose values passes the
    other keywords, a oneOf branch inside another); the automaton rejects an empty language,
    so such nodes are tested by searching their lazily built automaton for an accepted
    string. Past `budget` states the node is kept as it is."""
    if not isinstance(node, Both | Minus):
        return node
    import time

    from tgix.grammar.lazy_dfa import LazyDFA

    try:  # only the start's liveness is searched (lazy_product), not the whole automaton
        LazyDFA(node, budget, time.monotonic() + 3600)
    except GrammarError as e:
        if "matches no string" in str(e):
            return NEVER
    return node


def minus(keep: Node, drop: Node) -> Node:
    if keep == NEVER or drop == NEVER:
        return keep
    return Minus(keep, drop)


@dataclass(frozen=True, slots=True)
class Layout:
    """JSON punctuation with `ws` (a regex) after `{ [ , :` and before `} ]`."""

    ws: str

    @property
    def space(self) -> Node:
        return Regex(self.ws) if self.ws else EMPTY

    @property
    def comma(self) -> Node:
        return cat(literal(","), self.space)

    def member(self, key: Node, value: Node) -> Node:
        return cat(key, literal(":"), self.space, value)

    def container(self, open_: str, close: str, items: Node, empty_ok: bool) -> Node:
        """`open items close` where `items` is the non-empty content (NEVER if none allowed)."""
        body = union(cat(items, self.space), EMPTY if empty_ok else NEVER)
        return cat(literal(open_), self.space, body, literal(close))

    def separated(self, first: Node, rest: Node, lo: int, hi: int | None) -> Node:
        """`first (, rest){lo,hi}`: a non-empty comma-separated list."""
        return cat(first, repeat(cat(self.comma, rest), lo, hi))


def number_literal(value: int | float) -> Node:
    """The JSON texts of a number value: Python's (json.dumps) spelling, plus the integer
    spelling of an integral float (`1.0` and `1` are the same JSON Schema value)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return NEVER
        texts = [json.dumps(value)]
        if value.is_integer():
            texts.append(str(int(value)))
            texts.append(str(int(value)) + ".0")
        return union(*(literal(t) for t in texts))
    return union(literal(str(value)), literal(f"{value}.0"))


def value_literal(value: object, layout: Layout, canonical: bool = False) -> Node:
    """Exactly the JSON text of `value`: canonical strings and numbers, objects with keys in
    the given order, arrays in order, the whitespace policy between tokens. `canonical`:
    numbers only in their plain decimal spelling (`canonical_number_text`)."""
    if value is None:
        return literal("null")
    if value is True or value is False:
        return literal("true" if value else "false")
    if isinstance(value, int | float):
        return literal(canonical_number_text(value)) if canonical else number_literal(value)
    if isinstance(value, str):
        return literal(json_string_text(value))
    if isinstance(value, list):
        items = [value_literal(v, layout, canonical) for v in value]
        if not items:
            return layout.container("[", "]", NEVER, True)
        return layout.container("[", "]", _join(items, layout), False)
    if isinstance(value, dict):
        members = [
            layout.member(literal(json_string_text(str(k))), value_literal(v, layout, canonical))
            for k, v in value.items()
        ]
        if not members:
            return layout.container("{", "}", NEVER, True)
        return layout.container("{", "}", _join(members, layout), False)
    raise TypeError(f"not a JSON value: {value!r}")


def _join(items: list[Node], layout: Layout) -> Node:
    out = [items[0]]
    for item in items[1:]:
        out += [layout.comma, item]
    return cat(*out)


def json_type(value: object) -> str:
    """The JSON Schema type name of a JSON value ("integer" for integral numbers)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def json_equal(a: object, b: object) -> bool:
    """JSON Schema equality: numbers by value, booleans distinct from numbers, objects
    unordered."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@dataclass
class Context:
    """State shared by one conversion: the layout, the options, the notes for the caller and
    a count of approximations (a subschema compiled with the count unchanged is exact, which
    `oneOf` needs before it subtracts one branch from another)."""

    options: GrammarOptions
    notes: list[str] = field(default_factory=list)
    approximations: int = 0

    @property
    def layout(self) -> Layout:
        return Layout(self.options.whitespace)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def approximate(self, message: str) -> None:
        """Record that the grammar accepts a strict subset of the schema's instances."""
        self.approximations += 1
        self.note(message)
