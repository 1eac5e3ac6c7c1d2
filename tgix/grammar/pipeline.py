"""One grammar, source to token index: what a compile worker runs.

Budgets: `options.max_states` bounds automaton size; `options.timeout_s` is checked inside
every loop and, in worker processes, also enforced by a SIGALRM timer, so a pathological
regex inside a library call still stops with a GrammarError.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tgix.grammar import regex_tree as rt
from tgix.grammar.automaton import ByteDFA, build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.index import TokenIndex, build_index
from tgix.grammar.lazy_dfa import LazyDFA
from tgix.grammar.lazy_index import LazyPushdownIndex, LazyTokenIndex, single_bytes
from tgix.grammar.nfa import check_deadline
from tgix.grammar.options import GrammarOptions
from tgix.grammar.pushdown import (
    Nesting,
    PushdownIndex,
    combine,
    container_dfa,
    has_nesting,
    trapped_dfa,
)
from tgix.grammar.spec import GrammarSpec
from tgix.grammar.token_trie import Trie
from tgix.grammar.vocabulary import TokenVocabulary


@dataclass(frozen=True, slots=True)
class CompiledArrays:
    """A token index without its vocabulary: what crosses process boundaries and the disk.
    For a grammar with run-time nesting (tgix.grammar.pushdown) `table` / `accepting` are the
    combined automaton, `nesting` its packed `Nesting`, and `trapped` the index's per-state
    trapped token ids as [states..., offsets..., ids...] (see _pack_trapped)."""

    table: np.ndarray
    accepting: np.ndarray
    row_of: np.ndarray
    masks: np.ndarray
    stats: dict
    nesting: np.ndarray | None = None
    trapped: np.ndarray | None = None

    def attach(self, vocab: TokenVocabulary) -> TokenIndex | PushdownIndex:
        real = ByteDFA(self.table, self.accepting)
        if self.nesting is None:
            return TokenIndex(real, vocab, self.row_of, self.masks, self.stats)
        nesting = Nesting.unpack(self.nesting)
        walk_dfa, _, _ = trapped_dfa(real, nesting)
        base = TokenIndex(walk_dfa, vocab, self.row_of, self.masks, self.stats)
        base.trapped = _unpack_trapped(self.trapped)
        return PushdownIndex(base, real, nesting)

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything but stats, by name (np.savez); `from_arrays` reverses it."""
        out = {k: getattr(self, k) for k in ("table", "accepting", "row_of", "masks")}
        if self.nesting is not None:
            out.update(nesting=self.nesting, trapped=self.trapped)
        return out

    @classmethod
    def from_arrays(cls, arrays, stats: dict) -> CompiledArrays:
        extra = {k: arrays[k] for k in ("nesting", "trapped") if k in arrays}
        names = ("table", "accepting", "row_of", "masks")
        return cls(*(arrays[k] for k in names), stats, **extra)


def _pack_trapped(trapped: dict[int, np.ndarray]) -> np.ndarray:
    states = sorted(trapped)
    sizes = [len(trapped[s]) for s in states]
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    ids = [trapped[s] for s in states] or [np.zeros(0, np.int32)]
    head = np.asarray([len(states), *states, *offsets], dtype=np.int64)
    return np.concatenate([head, np.concatenate(ids).astype(np.int64)])


def _unpack_trapped(packed: np.ndarray) -> dict[int, np.ndarray]:
    n = int(packed[0])
    states, offsets = packed[1 : 1 + n], packed[1 + n : 2 + 2 * n]
    ids = packed[2 + 2 * n :].astype(np.int32)
    return {int(s): ids[offsets[i] : offsets[i + 1]] for i, s in enumerate(states)}


def to_tree(spec: GrammarSpec, options: GrammarOptions) -> tuple[rt.Node, list[str]]:
    if spec.kind == "regex":
        return rt.Regex(spec.value), []
    if spec.kind == "json":
        from tgix.grammar.json_schema import schema_to_tree

        return schema_to_tree(spec.schema(), options)
    raise GrammarError(f"unknown grammar kind {spec.kind!r}")


def compile_arrays(
    spec: GrammarSpec, vocab: TokenVocabulary, trie: Trie, options: GrammarOptions
) -> CompiledArrays:
    t0 = time.monotonic()
    deadline = t0 + options.timeout_s
    tree, notes = to_tree(spec, options)
    check_deadline(deadline)
    t1 = time.monotonic()
    dfa = build_dfa(tree, options.max_states, deadline)
    nesting = None
    if has_nesting(dfa):
        dfa, nesting = combine(dfa, options)
    t2 = time.monotonic()
    if nesting is not None:
        walk_dfa, trap, seeds = trapped_dfa(dfa, nesting)
        index = build_index(walk_dfa, vocab, trie, deadline, trap=trap, seeds=seeds)
    else:
        index = build_index(dfa, vocab, trie, deadline)
    stats = dict(index.stats, tree_s=t1 - t0, dfa_s=t2 - t1, total_s=time.monotonic() - t0)
    stats["notes"] = notes
    if nesting is None:
        return CompiledArrays(dfa.table, dfa.accepting, index.row_of, index.masks, stats)
    stats["trapped_states"] = len(index.trapped)
    packed = _pack_trapped(index.trapped)
    return CompiledArrays(
        dfa.table, dfa.accepting, index.row_of, index.masks, stats, nesting.pack(), packed
    )


MASK_BUDGET_S = 2.0  # the most one lazily built mask may take (the engine thread waits on it)
# Lazily built states are not minimised and a mask's walk builds the end state of every token
# it allows, so a grammar gets this many times the eager budget (1 KiB of table per state).
LAZY_STATES = 4


def compile_lazy(
    spec: GrammarSpec, vocab: TokenVocabulary, trie: Trie, options: GrammarOptions
) -> LazyTokenIndex | LazyPushdownIndex | TokenIndex | PushdownIndex:
    """A grammar usable as soon as its start state is: the tree and its NFA are built, then
    the start state's mask; every other state's row and mask when generation reaches it
    (tgix.grammar.lazy_dfa, lazy_index)."""
    t0 = time.monotonic()
    tree, notes = to_tree(spec, options)
    t1 = time.monotonic()
    deadline = t0 + options.timeout_s
    container = lambda: container_dfa(options)
    budget = LAZY_STATES * options.max_states
    dfa = LazyDFA(tree, budget, deadline, container, single_bytes(vocab))
    t2 = time.monotonic()
    stats = {"lazy": True, "tree_s": t1 - t0, "nfa_s": t2 - t1, "notes": notes}
    base = LazyTokenIndex(dfa, vocab, trie, min(options.timeout_s, MASK_BUDGET_S), stats)
    index = LazyPushdownIndex(base) if dfa.nested else base
    if not index.mask(index.start).any():
        raise GrammarError("this model's vocabulary cannot produce any string of the grammar")
    stats["first_mask_s"] = time.monotonic() - t0
    return index
