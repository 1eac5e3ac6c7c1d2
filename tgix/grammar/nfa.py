"""Regex tree -> byte-level NFA (Thompson construction, epsilon edges, byte-range edges).

Regex leaves are parsed by interegular into its pattern AST, whose character groups become
UTF-8 byte-range chains (`utf8.byte_sequences`); the subset construction in `automaton`
then makes it deterministic over bytes. Intersections and differences are built as DFAs
first (`automaton.product`) and embedded back as NFA fragments.
"""

from __future__ import annotations

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
            if len(self.eps) > 20 * self.max_states:
                raise GrammarError(f"grammar too large (more than {self.max_states} states)")
            check_deadline(self.deadline)
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

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


def build(nfa: Nfa, node: rt.Node, embed_dfa: Callable) -> tuple[int, int]:
    """Fragment for a tree node; `embed_dfa(nfa, node)` handles Both / Minus."""
    if isinstance(node, rt.Regex):
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
