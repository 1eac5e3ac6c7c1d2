"""Token masks built on demand: a state's mask is walked the first time a row reaches it.

`LazyTokenIndex` has TokenIndex's interface (mask / allows / advance / forced_token /
is_accepting) over a `LazyDFA`. A mask is one walk of the vocabulary's byte trie from one
state, level by level in numpy on (node, state) pairs, computing the automaton rows the walk
reaches as it goes; a token whose bytes all loop on the state (inside a JSON string: most of
them) is settled without walking (the same shortcut as trie_walk). Masks, forced tokens and
token steps are cached per grammar, so a state costs its walk once.

Liveness: a token is allowed when its walk stays alive and ends in a state that reaches
acceptance through one-byte tokens alone (`LazyDFA.token_live`, from an NFA-level search
that is skipped when every edge reads some one-byte token). That is the eager index's rule
whenever its own shortcut applies; where it does not (a vocabulary missing some bytes as
tokens), it may refuse a token whose only ways on need multi-byte tokens, never trap a row.

Thread safety: the engine may build a state's mask on a background thread (engine's
mask_builder) while its own thread advances other rows. Automaton rows are computed under the
grammar's lock (lazy_shared.Shared); a mask build holds the index's `build_lock`, and a mask
is published (`has_mask` true) only after its trapped list. A state whose build failed (a
budget) keeps its error: asking again raises it at once instead of spending the budget again.

With nesting, pushes and pops are trapped as in pushdown.trapped_dfa (a token whose walk
opens a container at a NESTED state, or closes the innermost one, is listed per state), and
`LazyPushdownIndex` checks those tokens against the stack as PushdownIndex does.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

from tgix.grammar.automaton import DEAD
from tgix.grammar.errors import GrammarError
from tgix.grammar.index import FINISHED, TokenIndex
from tgix.grammar.lazy_dfa import LazyDFA
from tgix.grammar.nfa import check_deadline
from tgix.grammar.pushdown import PushdownIndex, State, walk_steps
from tgix.grammar.token_trie import Trie
from tgix.grammar.trie_walk import looping_nodes
from tgix.grammar.vocabulary import TokenVocabulary

TRAP = -3  # a walk that pushed or popped (pushdown): settled by the stack machine
AHEAD_OF = 24  # successors listed per state (more: none listed; a guess would miss)
_OPEN = np.zeros(256, dtype=bool)
_OPEN[[ord("{"), ord("[")]] = True
_NONE = np.zeros(0, dtype=np.int32)


_THREAD = threading.local()


def build_politely() -> None:
    """Mark the calling thread as a background mask builder: its trie walks give up the GIL
    at every level (a waiting engine thread would otherwise wait up to Python's 5 ms switch
    interval past its own wait budget)."""
    _THREAD.polite = True


def single_bytes(vocab: TokenVocabulary) -> np.ndarray:
    """[256] bool: the bytes some token spells alone (read-only; computed once per
    vocabulary: a pass over every token would cost a new grammar milliseconds)."""
    return _per_vocab(vocab).singles


class _VocabArrays:
    """What every lazy index over one vocabulary and trie reads: built once, shared."""

    def __init__(self, vocab: TokenVocabulary, trie: Trie | None):
        self.vocab, self.trie = vocab, trie  # held: the cache is keyed by their ids
        if trie is not None:  # the vocabulary's entry holds the one-byte set
            self.singles = _per_vocab(vocab).singles
        else:
            singles = np.zeros(256, dtype=bool)
            singles[[b[0] for b in vocab.token_bytes if b is not None and len(b) == 1]] = True
            singles.flags.writeable = False
            self.singles = singles
            return
        width = -(-vocab.size // 32)
        self.node_of_id = np.full(width * 32, trie.num_nodes, dtype=np.int64)
        self.node_of_id[trie.token_ids] = trie.token_node
        self.level1 = np.arange(trie.offsets[0], trie.offsets[1])
        self.has_parent = trie.parent >= 0
        self.parent = np.maximum(trie.parent, 0)
        self.finished = np.zeros(width, dtype=np.uint32)
        for e in vocab.eos_ids:
            self.finished[e // 32] |= np.uint32(1 << (e % 32))
        for a in (self.node_of_id, self.level1, self.has_parent, self.parent):
            a.flags.writeable = False


_VOCAB_ARRAYS: OrderedDict = OrderedDict()  # (id(vocab), id(trie)) -> _VocabArrays


def _per_vocab(vocab: TokenVocabulary, trie: Trie | None = None) -> _VocabArrays:
    key = (id(vocab), id(trie))
    found = _VOCAB_ARRAYS.get(key)
    if found is None:
        found = _VOCAB_ARRAYS[key] = _VocabArrays(vocab, trie)
        while len(_VOCAB_ARRAYS) > 8:
            _VOCAB_ARRAYS.popitem(last=False)
    return found


class LazyTokenIndex:
    """masks: state -> [W] uint32 (bit t of word t // 32 allows token t), W = ceil(V / 32)."""

    def __init__(
        self, dfa: LazyDFA, vocab: TokenVocabulary, trie: Trie, budget_s: float, stats: dict
    ):
        self.dfa, self.vocab, self.trie, self.stats = dfa, vocab, trie, stats
        self.start = 0
        self.budget_s = budget_s
        self.eos_ids = frozenset(vocab.eos_ids)
        self.width = -(-vocab.size // 32)
        shared = _per_vocab(vocab, trie)
        self.node_of_id, self._level1 = shared.node_of_id, shared.level1
        self._has_parent, self._parent = shared.has_parent, shared.parent
        self._masks: dict[int, np.ndarray] = {}
        self._forced: dict[int, int] = {}
        self._next: dict[tuple[int, int], int] = {}
        self.trapped: dict[int, np.ndarray] = {}
        self.mask_seconds: list[float] = []  # per computed mask (bounded: see _build)
        self._finished = shared.finished
        self._failed: dict[int, str] = {}  # state -> why its mask could not be built
        self._last_walk: tuple | None = None  # (state, ends, allowed) of the build just run
        self._keep_walk = False  # only mask_and_successors keeps it
        self.build_lock = threading.RLock()

    @property
    def num_states(self) -> int:
        """States built so far (grows as generation reaches new ones)."""
        return self.dfa.num_states

    def mask(self, state: int) -> np.ndarray:
        """[W] uint32 allowed tokens from `state` (after EOS: only EOS)."""
        if state == FINISHED:
            return self._finished
        words = self._masks.get(state)
        if words is None:
            with self.build_lock:
                words = self._masks.get(state)
                if words is None:
                    words = remember_failure(self._failed, state, self._build)
        return words

    def mask_and_successors(self, state: int) -> list[int]:
        """Build state's mask (if needed); then, if this call built it, the states its
        allowed tokens lead to that have no mask yet, when they are few (<= AHEAD_OF; else
        none: a guess would miss). What the engine's mask builder builds ahead (off the
        first mask's path: the pass over V end states costs ~0.5 ms)."""
        with self.build_lock:
            self._keep_walk, self._last_walk = True, None
            try:
                self.mask(state)
            finally:
                walked, self._last_walk, self._keep_walk = self._last_walk, None, False
        if walked is None or walked[0] != state:
            return []
        _, ends, allowed = walked
        reached = ends[allowed[: len(ends)] & (ends >= 0)]
        nxt = np.flatnonzero(np.bincount(reached)) if reached.size else reached
        if len(nxt) > AHEAD_OF:
            return []
        return [q for q in nxt.tolist() if q != state and q not in self._masks]

    def has_mask(self, state: int) -> bool:
        """True when mask(state) returns at once: built, or failed (it raises at once)."""
        return state == FINISHED or state in self._masks or state in self._failed

    def is_accepting(self, state: int) -> bool:
        return state == FINISHED or bool(self.dfa.accepting[state])

    def allows(self, state: int, token_id: int) -> bool:
        return bool((int(self.mask(state)[token_id >> 5]) >> (token_id & 31)) & 1)

    advance = TokenIndex.advance  # the state after a token, cached (GrammarError if refused)

    def _token_end(self, state: int, token_id: int) -> int:
        return self._timed(lambda: self.dfa.walk(self.vocab.token_bytes[token_id], state))

    def forced_token(self, state: int) -> int | None:
        """The only allowed token when there is exactly one and it is not EOS."""
        if state == FINISHED:
            return None
        forced = self._forced.get(state)
        if forced is None:
            words = self.mask(state)
            forced = -1
            if int(np.bitwise_count(words).sum()) == 1:
                bits = np.unpackbits(words.view(np.uint8), bitorder="little")
                token = int(np.flatnonzero(bits)[0])
                forced = -1 if token in self.eos_ids else token
            self._forced[state] = forced
        return None if forced < 0 else forced

    # -- building a mask ----------------------------------------------------------------

    def _timed(self, work):
        """Run `work` under this grammar's per-call budget (the engine thread waits on it)."""
        self.dfa.deadline = time.monotonic() + self.budget_s
        return work()

    def _build(self, state: int) -> np.ndarray:
        t0 = time.perf_counter()
        ends = self._timed(lambda: self._walk(state))
        allowed = self.dfa.token_live[ends]  # DEAD and TRAP read False
        if self.dfa.accepting[state]:
            allowed[list(self.eos_ids)] = True
        words = np.packbits(allowed, bitorder="little").view("<u4")
        trapped = np.flatnonzero(ends == TRAP)
        if trapped.size:
            self.trapped[state] = trapped.astype(np.int32)
        if self._keep_walk:  # mask_and_successors asked (under build_lock): V-long arrays
            self._last_walk = (state, ends, allowed)
        self._masks[state] = words
        if len(self.mask_seconds) < 1 << 16:
            self.mask_seconds.append(time.perf_counter() - t0)
        return words

    def _walk(self, start: int) -> np.ndarray:
        """[W * 32] end state per token id from `start` (DEAD: some byte has no edge, or no
        bytes; TRAP: the walk pushed or popped)."""
        dfa, trie = self.dfa, self.trie
        n = trie.num_nodes
        node_state = np.full(n + 1, DEAD, dtype=np.int32)
        row = dfa.row(start)
        loops = row == start
        if dfa.nested and dfa.calls[start] != DEAD:
            loops &= ~_OPEN
        if loops.any():
            looping = looping_nodes(trie, loops)
            parent_looping = np.where(self._has_parent, looping[self._parent], True)
            node = np.flatnonzero(parent_looping & ~looping)
            node_state[:n][looping] = start
        else:
            node = self._level1
        state = np.full(len(node), start, dtype=np.int32)
        polite = getattr(_THREAD, "polite", False)
        while node.size:
            check_deadline(dfa.deadline)
            if polite:  # a background builder: let a waiting engine thread have the GIL
                time.sleep(0)
            nxt = np.full(len(node), TRAP, dtype=np.int32)
            moving = state >= 0
            src, label = state[moving], trie.label[node[moving]]
            dfa.ensure(src)
            got = dfa.table[src, label]
            if dfa.nested:
                pushes = (dfa.calls[src] != DEAD) & _OPEN[label]
                got = np.where(pushes | (got == dfa.g_final), TRAP, got)
            nxt[moving] = got
            alive = nxt != DEAD
            node, state = node[alive], nxt[alive]
            node_state[node] = state
            counts = trie.num_children[node]
            has = counts > 0
            node, state, counts = node[has], state[has], counts[has]
            if not node.size:
                break
            firsts = np.repeat(trie.first_child[node] - np.cumsum(counts) + counts, counts)
            node = firsts + np.arange(int(counts.sum()))
            state = np.repeat(state, counts)
        return node_state[self.node_of_id]


def remember_failure(failed: dict, state, build):
    """build(state), recording why it failed under `state`: the next call raises that as a
    GrammarError at once (a budget is not spent twice; any other failure, too, ends only the
    requests that reach this state, as a grammar error)."""
    why = failed.get(state)
    if why is not None:
        raise GrammarError(why)
    try:
        return build(state)
    except GrammarError as exc:
        failed[state] = str(exc)
        raise
    except Exception as exc:
        failed[state] = f"building a mask failed: {type(exc).__name__}: {exc}"
        raise


class LazyPushdownIndex(PushdownIndex):
    """PushdownIndex over a LazyDFA with nesting: `base` (a LazyTokenIndex) gives each
    state's mask without pushes and pops, and its trapped tokens."""

    def __init__(self, base: LazyTokenIndex):  # PushdownIndex's fields, from a LazyDFA
        self.base, self.dfa = base, base.dfa
        self.start = 0
        self.vocab, self.eos_ids, self.stats = base.vocab, base.eos_ids, base.stats
        self._masks: OrderedDict[State, np.ndarray] = OrderedDict()
        self._next: dict[tuple[State, int], State] = {}
        self._failed: dict[State, str] = {}

    def mask(self, state: State) -> np.ndarray:
        """As PushdownIndex.mask, one build at a time (see the module's thread safety)."""
        words = self._masks.get(state)
        if words is not None:
            return words
        with self.base.build_lock:
            return remember_failure(self._failed, state, super().mask)

    def mask_and_successors(self, state: State) -> list[int]:
        """As LazyTokenIndex's, for a state with no stack to check (an int whose walks
        neither push nor pop); other states only build their mask."""
        if isinstance(state, int) and state != FINISHED:
            ahead = self.base.mask_and_successors(state)
            if state not in self.base.trapped:
                return ahead
        self.mask(state)
        return []

    def has_mask(self, state: State) -> bool:
        if state == FINISHED or state in self._masks or state in self._failed:
            return True
        if not isinstance(state, int) or not self.base.has_mask(state):
            return False
        return state not in self.base.trapped  # else its own mask, in _masks

    def walk(self, configs: frozenset, data: bytes) -> frozenset:
        dfa = self.dfa
        return walk_steps(dfa.step, lambda q: int(dfa.calls[q]), dfa, configs, data)

    def _precomputed(self, state: State) -> bool:
        if not isinstance(state, int):
            return False
        self.base.mask(state)  # builds it, and its trapped list
        return state not in self.base.trapped

    def _compute(self, state: State) -> np.ndarray:
        words = np.zeros(self.width, dtype=np.uint32)
        token_bytes = self.vocab.token_bytes
        for q, stack in self.configurations(state):
            words |= self.base.mask(q)
            for t in self.base.trapped.get(q, _NONE).tolist():
                if self.walk(frozenset({(q, stack)}), token_bytes[t]):
                    words[t >> 5] |= np.uint32(1 << (t & 31))
        return words

    def is_accepting(self, state: State) -> bool:
        if state == FINISHED:
            return True
        return any(not stack and self.dfa.accepting[q] for q, stack in self.configurations(state))
