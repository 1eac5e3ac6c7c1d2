"""A small regex expression tree: what grammar sources (a user regex, a JSON Schema) compile to
before the automaton is built.

Leaves are regex text in interegular's syntax (`Regex`); inner nodes are sequence,
alternation, bounded repetition, intersection (`Both`) and difference (`Minus`). The last two
are why a tree exists at all: JSON Schema needs them for `pattern` next to `minLength` /
`maxLength`, `allOf` of non-object schemas and additional property names that must differ
from the declared ones; a regex string cannot express them. A tree without them flattens
back to one regex string (`to_regex`), also the form used in error messages.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

_SPECIAL = set("\\.^$*+?{}[]()|/-")


@dataclass(frozen=True, slots=True)
class Regex:
    """A regex in interegular's syntax (no anchors, no lookaround, no backreferences)."""

    source: str


@dataclass(frozen=True, slots=True)
class RawByte:
    """One raw byte outside UTF-8 text (0xF8-0xFF never occur in it): a marker edge the
    automaton keeps, e.g. tgix.grammar.pushdown's "a nested container goes here"."""

    value: int


class _CachedHash:
    """Inner nodes hash once: trees are deduplicated in dicts (alternatives, memo tables),
    and a dataclass hash would walk the whole subtree every time (quadratic on big schemas)."""

    __slots__ = ()

    def __post_init__(self) -> None:
        values = tuple(getattr(self, name) for name in _compared(type(self)))
        object.__setattr__(self, "_hash", hash((type(self).__name__, values)))

    def cached_hash(self) -> int:
        return self._hash


_COMPARED: dict[type, tuple[str, ...]] = {}


def _compared(cls: type) -> tuple[str, ...]:
    """The names of cls's compared fields (dataclasses.fields is slow: once per class)."""
    names = _COMPARED.get(cls)
    if names is None:
        names = _COMPARED[cls] = tuple(f.name for f in fields(cls) if f.compare)
    return names


def _hash_field():
    return field(init=False, repr=False, compare=False, default=0)


def _digest_field():
    return field(init=False, repr=False, compare=False, default=b"")


_LEAF_DIGESTS: dict[str, bytes] = {}  # leaves are frozen, slotted: no field to cache it in


def digest(node: Node) -> bytes:
    """16 bytes naming a tree's content: equal trees, equal digests. Cached on inner nodes,
    so it costs one pass over a tree's distinct node objects, where `==` on two equal but
    distinct trees walks every path (exponential in a tree whose subtrees are shared, as
    unrolled recursive `$ref`s are). What cross-grammar caches key on."""
    if isinstance(node, Regex):
        found = _LEAF_DIGESTS.get(node.source)
        if found is None:
            if len(_LEAF_DIGESTS) >= 1 << 16:
                _LEAF_DIGESTS.clear()
            found = _LEAF_DIGESTS[node.source] = hashlib.blake2b(
                b"r" + node.source.encode("utf-8", "surrogatepass"), digest_size=16
            ).digest()
        return found
    if isinstance(node, RawByte):
        return bytes([node.value]) * 16
    found = node._digest
    if not found:
        h = hashlib.blake2b(type(node).__name__.encode(), digest_size=16)
        for name in _compared(type(node)):
            value = getattr(node, name)
            if isinstance(value, tuple):
                h.update(b"(%d" % len(value))
                for part in value:
                    h.update(digest(part))
            elif isinstance(value, int | None):
                h.update(b"i" + repr(value).encode())
            else:
                h.update(digest(value))
        found = h.digest()
        object.__setattr__(node, "_digest", found)
    return found


@dataclass(frozen=True, slots=True)
class Seq(_CachedHash):
    parts: tuple[Node, ...]
    _hash: int = _hash_field()
    _digest: bytes = _digest_field()


@dataclass(frozen=True, slots=True)
class Alt(_CachedHash):
    options: tuple[Node, ...]
    _hash: int = _hash_field()
    _digest: bytes = _digest_field()


@dataclass(frozen=True, slots=True)
class Repeat(_CachedHash):
    """`node{lo,hi}`; hi None is unbounded."""

    node: Node
    lo: int
    hi: int | None
    _hash: int = _hash_field()
    _digest: bytes = _digest_field()


@dataclass(frozen=True, slots=True)
class Both(_CachedHash):
    """Strings matched by every part (language intersection)."""

    parts: tuple[Node, ...]
    _hash: int = _hash_field()
    _digest: bytes = _digest_field()


@dataclass(frozen=True, slots=True)
class Minus(_CachedHash):
    """Strings matched by `keep` and not by `drop` (language difference), e.g. additional
    property names that must differ from the declared ones."""

    keep: Node
    drop: Node
    _hash: int = _hash_field()
    _digest: bytes = _digest_field()


for _cls in (Seq, Alt, Repeat, Both, Minus):
    _cls.__hash__ = _CachedHash.cached_hash  # replaces the generated field-walking hash

Node = Regex | RawByte | Seq | Alt | Repeat | Both | Minus


_ESCAPES = {ord(ch): "\\" + ch for ch in _SPECIAL}
_ESCAPES.update({c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]})


def escape(text: str) -> str:
    """Regex source matching `text` literally (interegular's escapes: control characters as
    `\\xNN`, anything else outside ASCII as itself)."""
    return text.translate(_ESCAPES)


def literal(text: str) -> Regex:
    return Regex(escape(text))


def seq(*parts: Node) -> Node:
    flat: list[Node] = []
    for p in parts:
        flat.extend(p.parts if isinstance(p, Seq) else (p,))
    flat = [p for p in flat if type(p) is not Regex or p.source]  # drop empty leaves
    if len(flat) == 1:
        return flat[0]
    return Seq(tuple(flat))


def alt(*options: Node) -> Node:
    unique = list(dict.fromkeys(options))
    if len(unique) == 1:
        return unique[0]
    return Alt(tuple(unique))


def to_regex(node: Node) -> str | None:
    """The tree as one regex string, or None when it holds an intersection or difference."""
    if isinstance(node, Regex):
        return node.source
    if isinstance(node, Seq):
        parts = [to_regex(p) for p in node.parts]
        return None if None in parts else "".join(f"(?:{p})" for p in parts)
    if isinstance(node, Alt):
        options = [to_regex(p) for p in node.options]
        return None if None in options else "(?:" + "|".join(options) + ")"
    if isinstance(node, Repeat):
        inner = to_regex(node.node)
        if inner is None:
            return None
        hi = "" if node.hi is None else str(node.hi)
        return f"(?:{inner}){{{node.lo},{hi}}}"
    return None
