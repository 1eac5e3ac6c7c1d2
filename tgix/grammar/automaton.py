"""Regex tree -> minimal deterministic byte-level automaton (`ByteDFA`).

Subset construction runs over byte classes (bytes no NFA edge distinguishes), then Moore
partition refinement in numpy minimises, and states are renumbered breadth-first from the
start in byte order, so the same grammar always gives the same table (cacheable). States
that cannot reach an accepting state are removed: a dead transition is -1.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from tgix.grammar import regex_tree as rt
from tgix.grammar.errors import GrammarError
from tgix.grammar.nfa import Nfa, build, check_deadline

DEAD = -1


@dataclass(frozen=True, slots=True)
class ByteDFA:
    """table [S, 256] int32: next state per byte (-1 dead); accepting [S] bool; start 0."""

    table: np.ndarray
    accepting: np.ndarray
    start: int = 0

    @property
    def num_states(self) -> int:
        return self.table.shape[0]

    def walk(self, data: bytes, state: int | None = None) -> int:
        s = self.start if state is None else state
        for b in data:
            if s == DEAD:
                break
            s = int(self.table[s, b])
        return s

    def accepts(self, data: bytes) -> bool:
        s = self.walk(data)
        return s != DEAD and bool(self.accepting[s])


def build_dfa(node: rt.Node, max_states: int = 20_000, deadline: float | None = None) -> ByteDFA:
    """The minimal DFA of the tree's language over UTF-8 bytes; GrammarError past the
    state budget or the deadline (time.monotonic())."""
    deadline = time.monotonic() + 3600 if deadline is None else deadline
    nfa = Nfa(max_states, deadline)
    products: dict[rt.Node, ByteDFA] = {}  # a repeated intersection is built once

    def embed(nfa: Nfa, inner: rt.Node) -> tuple[int, int]:
        if inner not in products:
            products[inner] = _product(inner, max_states, deadline)
        return _embed(nfa, products[inner])

    entry, exit_ = build(nfa, node, embed)
    return _determinise(nfa, entry, exit_, max_states, deadline)


def _byte_classes(cuts: set[int]) -> np.ndarray:
    """class id [256] from the sorted starts of byte runs."""
    starts = np.zeros(257, dtype=bool)
    starts[sorted(cuts)] = True
    return (np.cumsum(starts[:256]) - 1).astype(np.int32)


def _determinise(nfa: Nfa, entry: int, exit_: int, max_states: int, deadline: float) -> ByteDFA:
    cuts = {0}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            cuts.update((lo, hi + 1))
    cuts.discard(256)
    class_of = _byte_classes(cuts)
    moves: list[dict[int, list[int]]] = []
    for edges in nfa.edges:
        by_class: dict[int, list[int]] = {}
        for lo, hi, t in edges:
            for c in range(class_of[lo], class_of[hi] + 1):
                by_class.setdefault(c, []).append(t)
        moves.append(by_class)
    closures: dict[int, frozenset[int]] = {}

    def closure(s: int) -> frozenset[int]:
        if s not in closures:
            seen, todo = {s}, [s]
            while todo:
                for t in nfa.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            closures[s] = frozenset(u for u in seen if moves[u] or u == exit_)
        return closures[s]

    start = closure(entry)
    closed: dict[frozenset[int], frozenset[int]] = {}  # targets of a move -> their closure
    ids, sets, rows = {start: 0}, [start], []
    num_classes = int(class_of[-1]) + 1
    while len(rows) < len(sets):
        if len(sets) > max_states:
            raise GrammarError(f"grammar too large (more than {max_states} automaton states)")
        if len(rows) % 256 == 0:
            check_deadline(deadline)
        targets: dict[int, list[int]] = {}
        for s in sets[len(rows)]:
            for c, ts in moves[s].items():
                targets.setdefault(c, []).extend(ts)
        row = [DEAD] * num_classes
        for c, ts in targets.items():
            moved = frozenset(ts)
            key = closed.get(moved)
            if key is None:
                key = closed[moved] = frozenset().union(*(closure(t) for t in moved))
            if key not in ids:
                ids[key] = len(sets)
                sets.append(key)
            row[c] = ids[key]
        rows.append(row)
    accepting = np.array([exit_ in s for s in sets], dtype=bool)
    table_c = np.array(rows, dtype=np.int32).reshape(-1, num_classes)
    return minimise(table_c, class_of, accepting, deadline)


def refine(
    full: np.ndarray, initial: np.ndarray, deadline: float, max_rounds: int | None = None
) -> np.ndarray:
    """Moore partition refinement over full [S, C] (total: every entry a state): block id
    per state of the partition that refines `initial` labels and is stable under every class
    (after `max_rounds` rounds: states agree on all strings up to that length). Each round
    groups states by (block, block of each successor) via a 64-bit hash of that row, checked
    exactly (a collision falls back to sorting the rows), so rounds stay O(S * C)."""
    multipliers = np.random.default_rng(0).integers(1, 2**62, full.shape[1] + 1, dtype=np.uint64)
    part = np.unique(initial, return_inverse=True)[1].reshape(-1).astype(np.int64)
    count = int(part.max()) + 1
    rounds = 0
    while max_rounds is None or rounds < max_rounds:
        rounds += 1
        check_deadline(deadline)
        rows = np.column_stack([part, part[full]])
        digest = (rows.astype(np.uint64) * (multipliers | np.uint64(1))).sum(axis=1)
        _, first, new = np.unique(digest, return_index=True, return_inverse=True)
        new = new.reshape(-1)
        if not (rows == rows[first[new]]).all():
            _, new = np.unique(rows, axis=0, return_inverse=True)
            new = new.reshape(-1)
        new_count = int(new.max()) + 1
        part = new
        if new_count == count:
            return part
        count = new_count
    return part


def minimise(
    table_c: np.ndarray, class_of: np.ndarray, accepting: np.ndarray, deadline: float = math.inf
) -> ByteDFA:
    """Moore refinement over table_c [S, C] (-1 dead), then co-reachability pruning and
    breadth-first renumbering from state 0."""
    num = table_c.shape[0]
    dead = num  # an explicit sink so every row is total
    full = np.vstack([np.where(table_c < 0, dead, table_c), np.full((1, table_c.shape[1]), dead)])
    part = refine(full, np.append(accepting, False), deadline)
    count = int(part.max()) + 1
    sink = part[dead]
    # BFS renumbering over byte classes in order; the sink class (which also holds every
    # state that cannot reach acceptance) becomes DEAD.
    rep = np.zeros(count, dtype=np.int64)
    rep[part] = np.arange(num + 1)
    order, new_id = [int(part[0])], {int(part[0]): 0}
    if order[0] == sink:
        raise GrammarError("the grammar matches no string at all")
    i = 0
    while i < len(order):
        for t in part[full[rep[order[i]]]]:
            t = int(t)
            if t != sink and t not in new_id:
                new_id[t] = len(order)
                order.append(t)
        i += 1
    remap = np.full(count, DEAD, dtype=np.int32)
    for old, new in new_id.items():
        remap[old] = new
    reps = rep[order]
    table = remap[part[full[reps]]][:, class_of]
    return ByteDFA(table=np.ascontiguousarray(table), accepting=part_accepting(accepting, reps))


def part_accepting(accepting: np.ndarray, reps: np.ndarray) -> np.ndarray:
    return np.append(accepting, False)[reps]


def _product(node: rt.Node, max_states: int, deadline: float) -> ByteDFA:
    """Intersection (Both) or difference (Minus) by the product construction."""
    if isinstance(node, rt.Both):
        dfas = [build_dfa(p, max_states, deadline) for p in node.parts]
        result = dfas[0]
        for other in dfas[1:]:
            result = _pair(result, other, keep_second=True, max_states=max_states)
        return result
    if isinstance(node, rt.Minus):
        keep = build_dfa(node.keep, max_states, deadline)
        drop = build_dfa(node.drop, max_states, deadline)
        return _pair(keep, drop, keep_second=False, max_states=max_states)
    raise GrammarError(f"unknown grammar node {type(node).__name__}")


def _pair(a: ByteDFA, b: ByteDFA, *, keep_second: bool, max_states: int) -> ByteDFA:
    """keep_second: accept where both accept; else where a accepts and b does not."""
    columns = np.column_stack([a.table.T, b.table.T])  # [256, Sa + Sb]
    _, class_of = np.unique(columns, axis=0, return_inverse=True)
    class_of = class_of.reshape(-1).astype(np.int32)
    reps = np.array([int(np.argmax(class_of == c)) for c in range(class_of.max() + 1)])
    ids, pairs, rows = {(0, 0): 0}, [(0, 0)], []
    while len(rows) < len(pairs):
        if len(pairs) > max_states:
            raise GrammarError(f"grammar too large (more than {max_states} automaton states)")
        sa, sb = pairs[len(rows)]
        na = a.table[sa, reps]
        nb = b.table[sb, reps] if sb != DEAD else np.full(len(reps), DEAD)
        row = []
        for ta, tb in zip(na.tolist(), nb.tolist(), strict=True):
            if ta == DEAD or (keep_second and tb == DEAD):
                row.append(DEAD)
                continue
            if (ta, tb) not in ids:
                ids[ta, tb] = len(pairs)
                pairs.append((ta, tb))
            row.append(ids[ta, tb])
        rows.append(row)
    acc_a = np.array([a.accepting[p] for p, _ in pairs])
    acc_b = np.array([q != DEAD and b.accepting[q] for _, q in pairs])
    accepting = acc_a & acc_b if keep_second else acc_a & ~acc_b
    return minimise(np.array(rows, dtype=np.int32), class_of, accepting)


def _embed(nfa: Nfa, dfa: ByteDFA) -> tuple[int, int]:
    """A DFA as an NFA fragment: one NFA state per DFA state, byte runs as range edges."""
    base = [nfa.new() for _ in range(dfa.num_states)]
    exit_ = nfa.new()
    for s in range(dfa.num_states):
        row = dfa.table[s]
        starts = np.flatnonzero(np.diff(row, prepend=-2) != 0)
        ends = np.append(starts[1:], 256) - 1
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            if row[lo] != DEAD:
                nfa.edges[base[s]].append((lo, hi, base[row[lo]]))
        if dfa.accepting[s]:
            nfa.eps[base[s]].append(exit_)
    return base[0], exit_
