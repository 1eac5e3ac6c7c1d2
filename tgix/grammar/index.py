"""Token index: for every automaton state a token can end in, the packed bitmask of tokens
allowed next. `TokenIndex` is what a request carries and the engine reads each step.

Build: breadth-first over states reachable at token boundaries; for a batch of states the
collapsed vocabulary trie is walked level by level on (state, node) pairs that are still
alive, so every distinct class prefix is stepped once per state. A token is allowed when all
its bytes have transitions (a token running past the end of the language dies on its extra
bytes) and its end state is *live*: some token sequence leads from it to acceptance. States
from which nothing can finish are pruned, and a grammar whose start is not live for this
vocabulary is an error at compile time rather than a trap mid-generation. EOS ids are allowed
exactly in accepting states.
"""

from __future__ import annotations

import time

import numpy as np

from tgix.grammar.automaton import DEAD, ByteDFA, refine
from tgix.grammar.errors import GrammarError
from tgix.grammar.nfa import check_deadline
from tgix.grammar.token_trie import Trie, collapse
from tgix.grammar.trie_walk import TrieWalker
from tgix.grammar.vocabulary import TokenVocabulary

FINISHED = -2  # the state after EOS


class TokenIndex:
    """masks [R, W] uint32: bit t of row r (word t // 32, bit t % 32) allows token t from the
    state whose row is r; W = ceil(V / 32). row_of [S] int32 maps automaton states to rows
    (-1: never reached at a token boundary). States are automaton state ids; start is 0."""

    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary, row_of, masks, stats: dict):
        self.dfa, self.vocab = dfa, vocab
        self.row_of, self.masks, self.stats = row_of, masks, stats
        self.start = 0
        self.eos_ids = frozenset(vocab.eos_ids)
        self._table = dfa.table
        self._next: dict[tuple[int, int], int] = {}
        counts = np.bitwise_count(masks).sum(axis=1)
        eos_any = np.zeros(len(masks), dtype=bool)
        for e in vocab.eos_ids:
            eos_any |= (masks[:, e // 32] >> np.uint32(e % 32)) & 1 == 1
        self._forced = np.full(len(masks), -1, dtype=np.int64)
        single = np.flatnonzero((counts == 1) & ~eos_any)
        self._forced[single] = _first_set_bit(masks[single])
        self.trapped: dict[int, np.ndarray] = {}  # see build_index(trap=)

    @property
    def num_states(self) -> int:
        return len(self.masks)

    @property
    def width(self) -> int:
        return self.masks.shape[1]

    def mask(self, state: int) -> np.ndarray:
        """[W] uint32 allowed tokens from `state` (after EOS: only EOS, to stay well-defined)."""
        if state == FINISHED:
            state = self._final_row_state()
        return self.masks[self.row_of[state]]

    def is_accepting(self, state: int) -> bool:
        return state == FINISHED or bool(self.dfa.accepting[state])

    def allows(self, state: int, token_id: int) -> bool:
        row = self.mask(state)
        return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)

    def advance(self, state: int, token_id: int) -> int:
        """The state after `token_id`; FINISHED after EOS; GrammarError if not allowed."""
        key = (state, token_id)
        nxt = self._next.get(key)
        if nxt is None:
            if not self.allows(state, token_id):
                raise GrammarError(f"token {token_id} is not allowed in state {state}")
            nxt = FINISHED if token_id in self.eos_ids else self._token_end(state, token_id)
            self._next[key] = nxt
        return nxt

    def _token_end(self, state: int, token_id: int) -> int:
        return self.dfa.walk(self.vocab.token_bytes[token_id], state)

    def forced_token(self, state: int) -> int | None:
        """The only allowed token when there is exactly one and it is not EOS."""
        if state == FINISHED:
            return None
        forced = int(self._forced[self.row_of[state]])
        return None if forced < 0 else forced

    def _final_row_state(self) -> int:
        return int(np.flatnonzero(self.dfa.accepting & (self.row_of >= 0))[0])


def _first_set_bit(masks: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")
    return np.argmax(bits, axis=1)


def build_index(
    dfa: ByteDFA,
    vocab: TokenVocabulary,
    byte_trie: Trie,
    deadline: float | None = None,
    *,
    trap: int | None = None,
    seeds: tuple[int, ...] = (),
) -> TokenIndex:
    """`trap`: a state where tokens hand over to a run-time check (tgix.grammar.pushdown):
    tokens ending there are left out of the masks and listed per state in
    `index.trapped` [state -> token ids]; states with such tokens count as live. `seeds`:
    states reached other than from the start by whole tokens, indexed too."""
    t0 = time.monotonic()
    deadline = t0 + 3600 if deadline is None else deadline
    columns, class_of = np.unique(dfa.table.T, axis=0, return_inverse=True)
    class_of = class_of.reshape(-1)
    table_c = np.ascontiguousarray(columns.T)  # [S, C]
    trie = collapse(byte_trie, class_of.astype(np.int32))
    width = -(-vocab.size // 32)
    walker = TrieWalker(table_c, trie, width * 32)
    if _single_bytes_finish_everywhere(vocab, dfa, table_c, class_of, trap):
        return _index_by_lookahead(dfa, vocab, walker, table_c, deadline, t0, trap)
    ends: dict[int, np.ndarray] = {}  # state -> [W * 32] end state per token id (DEAD: none)
    successors: dict[int, np.ndarray] = {}  # state -> distinct end states
    trapped: dict[int, np.ndarray] = {}  # state -> token ids ending in the trap
    marks = np.zeros(dfa.num_states + 1, dtype=bool)  # index -1 (DEAD) is the spare slot
    frontier = sorted({0, *seeds})
    while frontier:
        for batch in walker.batches(frontier):
            check_deadline(deadline)
            for s, row in zip(batch, walker.walk(batch), strict=True):
                if trap is not None:
                    hits = np.flatnonzero(row == trap)
                    if hits.size:
                        trapped[s] = hits.astype(np.int32)
                        row[hits] = DEAD
                ends[s] = row
                marks[row] = True
                successors[s] = np.flatnonzero(marks[:-1])
                marks[:] = False
        new = set()
        for s in frontier:
            new.update(successors[s].tolist())
        frontier = sorted(new - ends.keys())
    live = _live_states(successors, dfa.accepting, trapped.keys())
    if 0 not in live:
        raise GrammarError("this model's vocabulary cannot produce any string of the grammar")
    states = sorted(live)
    row_of = np.full(dfa.num_states, -1, dtype=np.int32)
    row_of[states] = np.arange(len(states), dtype=np.int32)
    live_mask = np.zeros(dfa.num_states + 1, dtype=bool)  # index -1 (DEAD) stays False
    live_mask[states] = True
    masks = np.zeros((len(states), width), dtype=np.uint32)
    eos = list(vocab.eos_ids)
    for lo in range(0, len(states), 256):
        check_deadline(deadline)
        chunk = states[lo : lo + 256]
        allowed = np.empty((len(chunk), width * 32), dtype=bool)
        for i, s in enumerate(chunk):
            if live_mask[successors[s]].all():  # the usual case: no token leads to a dead end
                np.greater_equal(ends[s], 0, out=allowed[i])
            else:
                np.take(live_mask, ends[s], out=allowed[i])
            if dfa.accepting[s]:
                allowed[i, eos] = True
        masks[lo : lo + len(chunk)] = np.packbits(allowed, axis=1, bitorder="little").view("<u4")
    stats = {
        "dfa_states": dfa.num_states,
        "token_states": len(states),
        "classes": table_c.shape[1],
        "trie_nodes": trie.num_nodes,
        "index_s": time.monotonic() - t0,
    }
    index = TokenIndex(dfa, vocab, row_of, masks, stats)
    index.trapped = {s: ids for s, ids in trapped.items() if row_of[s] >= 0}
    return index


def _single_bytes_finish_everywhere(vocab, dfa: ByteDFA, table_c, class_of, trap=None) -> bool:
    """True when from every state some path of single-byte tokens reaches acceptance (true
    for byte-level BPE and SentencePiece byte fallback on any grammar that needs no byte
    the vocabulary lacks alone). Then every end state of an allowed token is live, and
    masks need no token-level search for dead ends."""
    singles = np.zeros(256, dtype=bool)
    singles[[b[0] for b in vocab.token_bytes if b is not None and len(b) == 1]] = True
    usable = np.zeros(table_c.shape[1], dtype=bool)
    usable[class_of[singles]] = True
    src, cls = np.nonzero((table_c >= 0) & usable[None, :])
    dst = table_c[src, cls]
    order = np.argsort(dst, kind="stable")
    preds, bounds = src[order], np.searchsorted(dst[order], np.arange(dfa.num_states + 1))
    live = dfa.accepting.copy()
    if trap is not None:
        live[trap] = True  # the run-time check takes over there
    todo = list(np.flatnonzero(live))
    while todo:
        s = todo.pop()
        for p in preds[bounds[s] : bounds[s + 1]].tolist():
            if not live[p]:
                live[p] = True
                todo.append(p)
    return bool(live.all())


def _index_by_lookahead(dfa, vocab, walker, table_c, deadline, t0, trap=None) -> TokenIndex:
    """Masks for a vocabulary that spells every byte. A state's mask only depends on which
    strings up to the longest token stay alive from it, and on whether it accepts (EOS):
    states that agree on those (bounded Moore refinement, as many rounds as the longest
    token has bytes) share one mask, walked once. Long counted strings (maxLength 255: ~16
    states per character) collapse to a few hundred distinct masks."""
    num = dfa.num_states
    full = np.vstack([np.where(table_c < 0, num, table_c), np.full((1, table_c.shape[1]), num)])
    initial = np.append(dfa.accepting.astype(np.int64), 2)  # the sink (dead) apart
    if trap is not None:
        initial[trap] = 3  # states agreeing on strings up to L bytes also agree on the trap
    longest = max(len(b) for b in vocab.token_bytes if b)
    blocks = refine(full, initial, deadline, max_rounds=longest)[:num]
    reps = np.unique(blocks, return_index=True)[1]  # first state of each block
    row_of = np.unique(blocks, return_inverse=True)[1].reshape(-1).astype(np.int32)
    width = walker.node_of_id.shape[0] // 32
    masks = np.zeros((len(reps), width), dtype=np.uint32)
    eos = list(vocab.eos_ids)
    done, trapped_rows = 0, {}
    for batch in walker.batches(reps.tolist()):
        check_deadline(deadline)
        if trap is None:
            allowed = walker.walk(batch, alive_only=True)
        else:
            ends = walker.walk(batch)
            allowed = (ends != DEAD) & (ends != trap)
            for i in np.flatnonzero((ends == trap).any(axis=1)).tolist():
                trapped_rows[done + i] = np.flatnonzero(ends[i] == trap).astype(np.int32)
        allowed[np.ix_(dfa.accepting[batch], eos)] = True
        packed = np.packbits(allowed, axis=1, bitorder="little").view("<u4")
        masks[done : done + len(batch)] = packed
        done += len(batch)
    stats = {
        "dfa_states": num,
        "token_states": num,
        "distinct_masks": len(reps),
        "classes": table_c.shape[1],
        "trie_nodes": walker.trie.num_nodes,
        "index_s": time.monotonic() - t0,
    }
    index = TokenIndex(dfa, vocab, row_of, masks, stats)
    index.trapped = {
        s: trapped_rows[r] for s, r in enumerate(row_of.tolist()) if r in trapped_rows and s != trap
    }
    return index


def _live_states(successors: dict[int, np.ndarray], accepting: np.ndarray, more=()) -> set[int]:
    """States with a token path to acceptance or to one of `more` (those included)."""
    preds: dict[int, set[int]] = {}
    for s, ends in successors.items():
        for e in ends.tolist():
            preds.setdefault(e, set()).add(s)
    live = {s for s in successors if accepting[s]} | set(more)
    todo = list(live)
    while todo:
        for p in preds.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    return live
