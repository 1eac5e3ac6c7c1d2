"""Walking a vocabulary trie (collapsed onto a grammar's byte classes) from many automaton
states at once, in numpy: the inner loop of building a token index (tgix.grammar.index)."""

from __future__ import annotations

import numpy as np

from tgix.grammar.automaton import DEAD
from tgix.grammar.token_trie import Trie

_PAIR_BUDGET = 1 << 22  # (state, node) pairs per batch: bounds memory at ~100 MB


def looping_nodes(trie: Trie, loops: np.ndarray) -> np.ndarray:
    """[N] bool: nodes whose every label is in `loops` [labels] (from the state the walk
    starts in, the path stays put: settled without walking)."""
    ok = loops[trie.label]
    for d in range(2, len(trie.offsets)):
        lo, hi = trie.offsets[d - 1], trie.offsets[d]
        ok[lo:hi] &= ok[trie.parent[lo:hi]]
    return ok


class TrieWalker:
    """Steps batches of states through the collapsed trie; returns per state the end state
    of every token id [num_ids] (DEAD where some byte has no transition, or no bytes)."""

    def __init__(self, table_c: np.ndarray, trie: Trie, num_ids: int):
        self.trie = trie
        # per token id its trie node; ids without bytes read a spare always-DEAD column
        self.node_of_id = np.full(num_ids, trie.num_nodes, dtype=np.int64)
        self.node_of_id[trie.token_ids] = trie.token_node
        self.dtype = np.int16 if table_c.shape[0] < 2**15 else np.int32
        self.flat = table_c.reshape(-1).astype(np.int32)
        self.num_classes = table_c.shape[1]
        self.table_c = table_c
        self.has_parent = trie.parent >= 0
        self.parent = np.maximum(trie.parent, 0)

    def batches(self, states: list[int]):
        size = max(1, _PAIR_BUDGET // max(self.trie.num_nodes, 1))
        for lo in range(0, len(states), size):
            yield states[lo : lo + size]

    def walk(self, states: list[int], *, alive_only: bool = False) -> np.ndarray:
        """Self-loop shortcut: a token whose bytes all fall in classes that loop on the start
        state (inside a JSON string: nearly every token) ends there; only nodes where a path
        first leaves the loop are walked on."""
        trie, n = self.trie, self.trie.num_nodes
        if alive_only:  # just "some path": bool, and np.zeros is a lazily zeroed calloc
            node_state = np.zeros((len(states), n + 1), dtype=bool)
        else:
            node_state = np.full((len(states), n + 1), DEAD, dtype=self.dtype)
        start = np.array(states, dtype=np.int32)
        level1 = np.arange(trie.offsets[0], trie.offsets[1])
        origins, nodes = [], []
        loops = self.table_c[start] == start[:, None]  # [B, C]
        for i in range(len(states)):
            if not loops[i].any():  # no self-loop: walk from the first byte
                origins.append(np.full(len(level1), i))
                nodes.append(level1)
                continue
            looping = looping_nodes(self.trie, loops[i])
            parent_looping = np.where(self.has_parent, looping[self.parent], True)
            leaving = np.flatnonzero(parent_looping & ~looping)
            node_state[i, :n] = looping if alive_only else np.where(looping, start[i], DEAD)
            origins.append(np.full(len(leaving), i))
            nodes.append(leaving)
        origin, node = np.concatenate(origins), np.concatenate(nodes)
        state = start[origin]
        while node.size:
            nxt = self.flat[state * self.num_classes + trie.label[node]]
            alive = nxt != DEAD
            origin, node, state = origin[alive], node[alive], nxt[alive]
            node_state[origin, node] = True if alive_only else state
            counts = trie.num_children[node]
            has = counts > 0
            origin, node, state, counts = origin[has], node[has], state[has], counts[has]
            if not node.size:
                break
            starts = np.repeat(trie.first_child[node] - np.cumsum(counts) + counts, counts)
            child = starts + np.arange(int(counts.sum()))
            origin, state, node = np.repeat(origin, counts), np.repeat(state, counts), child
        return np.take(node_state, self.node_of_id, axis=1)
