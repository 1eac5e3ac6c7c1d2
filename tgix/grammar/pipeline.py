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
from tgix.grammar.nfa import check_deadline
from tgix.grammar.options import GrammarOptions
from tgix.grammar.spec import GrammarSpec
from tgix.grammar.token_trie import Trie
from tgix.grammar.vocabulary import TokenVocabulary


@dataclass(frozen=True, slots=True)
class CompiledArrays:
    """A TokenIndex without its vocabulary: what crosses process boundaries and the disk."""

    table: np.ndarray
    accepting: np.ndarray
    row_of: np.ndarray
    masks: np.ndarray
    stats: dict

    def attach(self, vocab: TokenVocabulary) -> TokenIndex:
        dfa = ByteDFA(self.table, self.accepting)
        return TokenIndex(dfa, vocab, self.row_of, self.masks, self.stats)


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
    t2 = time.monotonic()
    index = build_index(dfa, vocab, trie, deadline)
    stats = dict(index.stats, tree_s=t1 - t0, dfa_s=t2 - t1, total_s=time.monotonic() - t0)
    stats["notes"] = notes
    return CompiledArrays(dfa.table, dfa.accepting, index.row_of, index.masks, stats)
