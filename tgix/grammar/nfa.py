"""Regex tree -> byte-level NFA (Thompson construction, epsilon edges, byte-range edges).

Regex leaves are parsed by interegular into its pattern AST, whose character groups become
UTF-8 byte-range chains (`utf8.byte_sequences`); the subset construction in `automaton`
then makes it deterministic over bytes. Intersections and differences are built as DFAs
first (`automaton.product`) and embedded back as NFA fragments.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import lru_cache

import interegular
from interegular import patterns as ip

from tgix.grammar import regex_tree as rt
from tgix.grammar import utf8
from tgix.grammar.errors import GrammarError

_FLAGS_OK = ip.REFlags.CASE_INSENSITIVE | ip.REFlags.SINGLE_LINE


class Nfa:
    """States are ints; `eps[s]` lists epsilon targets, `edges[s]` (lo, hi, target) byte
    ranges. Fragments are (entry, exit) pairs."""

    def __init__(self, max_states: int, deadline: float):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.max_states, self.deadline = max_states, deadline

    def new(self) -> int:
        if len(self.eps) % 4096 == 0:
            self._check()
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def paste(self, template: Template) -> tuple[int, int]:
        """A fresh copy of a fragment built once (`leaf_template`): its states renumbered
        past the current ones, in one pass instead of a walk of the regex's syntax tree."""
        eps, edges, entry, exit_ = template
        base = len(self.eps)
        if (base + len(eps)) // 4096 != base // 4096:
            self._check()
        self.eps.extend([base + v for v in out] for out in eps)
        self.edges.extend([(lo, hi, base + t) for lo, hi, t in out] for out in edges)
        return base + entry, base + exit_

    def _check(self) -> None:
        if len(self.eps) > 20 * self.max_states:
            raise GrammarError(f"grammar too large (more than {self.max_states} states)")
        check_deadline(self.deadline)

    def chars(self, sequences: list[utf8.ByteRanges]) -> tuple[int, int]:
        entry, exit_ = self.new(), self.new()
        for seq in sequences:
            at = entry
            for i, (lo, hi) in enumerate(seq):
                nxt = exit_ if i == len(seq) - 1 else self.new()
                self.edges[at].append((lo, hi, nxt))
                at = nxt
        return entry, exit_

    def chain(self, fragments: list[tuple[int, int]]) -> tuple[int, int]:
        if not fragments:
            s = self.new()
            return s, s
        for (_, a_exit), (b_entry, _) in zip(fragments, fragments[1:], strict=False):
            self.eps[a_exit].append(b_entry)
        return fragments[0][0], fragments[-1][1]

    def union(self, fragments: list[tuple[int, int]]) -> tuple[int, int]:
        entry, exit_ = self.new(), self.new()
        for f_entry, f_exit in fragments:
            self.eps[entry].append(f_entry)
            self.eps[f_exit].append(exit_)
        return entry, exit_

    def repeat(self, build: Callable[[], tuple[int, int]], lo: int, hi: int | None):
        """`build` makes a fresh copy of the repeated fragment each call."""
        if hi is not None and hi < lo:
            raise GrammarError(f"invalid regex repetition {{{lo},{hi}}}: max below min")
        parts = [build() for _ in range(lo)]
        if hi is None:
            f_entry, f_exit = build()
            loop_entry, loop_exit = self.new(), self.new()
            self.eps[loop_entry] += [f_entry, loop_exit]
            self.eps[f_exit].append(loop_entry)
            parts.append((loop_entry, loop_exit))
        elif hi > lo:  # (an exit only when there is an optional part: no orphan states)
            tail_exit = self.new()
            optional = []
            for _ in range(hi - lo):
                f_entry, f_exit = build()
                self.eps[f_entry].append(tail_exit)
                optional.append((f_entry, f_exit))
            if optional:
                self.eps[optional[-1][1]].append(tail_exit)
                parts.append(self.chain(optional)[:1] + (tail_exit,))
        return self.chain(parts)


def check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise GrammarError("grammar compilation exceeded its time budget")


@lru_cache(maxsize=4096)
def _parse(source: str) -> ip.Pattern:
    try:
        return interegular.parse_pattern(source)
    except ip.Unsupported as exc:
        raise GrammarError(f"unsupported regex {source!r}: {str(exc) or 'construct'}") from None
    except Exception as exc:  # InvalidSyntax (no message), bare errors on malformed input
        reason = str(exc) or "syntax error (unbalanced brackets or parentheses?)"
        raise GrammarError(f"invalid regex {source!r}: {reason}") from None


@lru_cache(maxsize=4096)
def _class_sequences(chars: frozenset[str], negated: bool, fold: bool) -> list:
    points = {ord(c) for c in chars}
    if fold:
        points |= {ord(v) for c in chars for v in (c.lower(), c.upper()) if len(v) == 1}
    ranges = utf8.ranges_of(points)
    if negated:
        ranges = utf8.complement(ranges)
    return [seq for lo, hi in ranges for seq in utf8.byte_sequences(lo, hi)]


# A fragment as (eps, edges, entry, exit) with states numbered from 0 (see Nfa.paste).
_Edges = tuple[tuple[int, int, int], ...]
Template = tuple[tuple[tuple[int, ...], ...], tuple[_Edges, ...], int, int]
TEMPLATE_STATES = 256  # regex leaves whose fragment is larger are built anew each time


_META = r"\\.^$*+?{}\[\]()|"
_LITERAL = re.compile(rf"(?:\\[{_META}/-]|\\x[0-9a-fA-F]{{2}}|[^{_META}])*")
_PIECE = re.compile(r"\\x([0-9a-fA-F]{2})|\\(.)|(.)", re.S)


def _literal_bytes(source: str) -> bytes | None:
    """The UTF-8 of the one text a regex source matches when it is a literal
    (regex_tree.escape's output, plain words), else None (parsed as a regex)."""
    if len(source) > TEMPLATE_STATES or not _LITERAL.fullmatch(source):
        return None
    text = "".join(chr(int(h, 16)) if h else e or c for h, e, c in _PIECE.findall(source))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: left to the regex path's rules
        return None


class _TooLarge(Exception):
    pass


class _Scratch(Nfa):
    """Where a template is built: gives up as soon as it outgrows TEMPLATE_STATES."""

    def __init__(self):
        super().__init__(TEMPLATE_STATES, float("inf"))

    def new(self) -> int:
        if len(self.eps) >= TEMPLATE_STATES:
            raise _TooLarge
        return super().new()


@lru_cache(maxsize=4096)
def leaf_template(source: str) -> Template | None:
    """A regex leaf's fragment, built once per process: schemas repeat the same few leaves
    (quotes, separators, keys, string bodies) many times over. None when it is too large to
    be worth copying (it is then built in place, where a calling NFA may share its parts)."""
    data = _literal_bytes(source)
    if data is not None:  # a key, a quote, an enum value: a chain of bytes, no parse
        edges = tuple(((b, b, i + 1),) for i, b in enumerate(data)) + ((),)
        return ((),) * (len(data) + 1), edges, 0, len(data)
    scratch = _Scratch()
    try:
        entry, exit_ = _pattern(scratch, _parse(source), ip.REFlags(0))
    except _TooLarge:
        return None
    eps = tuple(tuple(out) for out in scratch.eps)
    return eps, tuple(tuple(out) for out in scratch.edges), entry, exit_


def build(nfa: Nfa, node: rt.Node, embed_dfa: Callable) -> tuple[int, int]:
    """Fragment for a tree node; `embed_dfa(nfa, node)` handles Both / Minus."""
    if isinstance(node, rt.Regex):
        template = leaf_template(node.source)
        if template is not None:
            return nfa.paste(template)
        return _pattern(nfa, _parse(node.source), ip.REFlags(0))
    if isinstance(node, rt.RawByte):
        return nfa.chars([[(node.value, node.value)]])
    if isinstance(node, rt.Seq):
        return nfa.chain([build(nfa, p, embed_dfa) for p in node.parts])
    if isinstance(node, rt.Alt):
        return nfa.union([build(nfa, p, embed_dfa) for p in node.options])
    if isinstance(node, rt.Repeat):
        return nfa.repeat(lambda: build(nfa, node.node, embed_dfa), node.lo, node.hi)
    return embed_dfa(nfa, node)


def _pattern(nfa: Nfa, p, flags: ip.REFlags) -> tuple[int, int]:
    kind = type(p).__name__
    if kind == "Pattern":
        flags = (flags | p.added_flags) & ~p.removed_flags
        if flags & ~_FLAGS_OK:
            raise GrammarError(f"unsupported regex flags {flags}")
        return nfa.union([_pattern(nfa, o, flags) for o in p.options])
    if kind == "_Concatenation":
        return nfa.chain([_pattern(nfa, part, flags) for part in p.parts])
    if kind == "_Repeated":
        return nfa.repeat(lambda: _pattern(nfa, p.base, flags), p.min, p.max)
    if kind == "_CharGroup":
        fold = bool(flags & ip.REFlags.CASE_INSENSITIVE)
        return nfa.chars(_class_sequences(p.chars, p.negated, fold))
    if kind == "__DotCls":
        newline = frozenset() if flags & ip.REFlags.SINGLE_LINE else frozenset("\n")
        return nfa.chars(_class_sequences(newline, True, False))
    if kind == "__EmptyCls":
        return nfa.chain([])
    raise GrammarError(f"unsupported regex construct ({kind}: lookaround or anchors)")
