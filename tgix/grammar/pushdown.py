"""Unbounded nesting at run time: a stack machine over two byte automata.

A JSON Schema's automaton spells unconstrained values out to `any_value_depth` levels; below
them an edge on the marker byte NESTED (json_any) from state p means "one complete array or
object here, then state calls[p]". The container automaton G (json_any.container_tree) has
such edges too. Both live in one combined table (schema states [0, S), G's after them):

  configuration (q, stack): q a state, stack the states to resume when the open containers
  close (bottom: a schema state). On byte b: the table's edge (q, b) if there is one; and
  when q has a NESTED edge and b opens a container, push calls[q] and go on in G after b.
  Reaching G's final state (a container just closed) pops: resume in the top state.

Both moves may apply (a schema that allows an explicit object or any value at one place), so
a generation state is a small frozenset of configurations; a schema state with an empty stack
is its plain int, so everything that never nests deeper than the explicit levels stays on the
precomputed path. States carry their stacks: the index keeps only bounded caches.

Masks: the token index is built over the combined table with a trap state that bracket bytes
at NESTED states and edges into G's final state lead to. Every token whose walk would push or
pop is listed per state (`trapped`: bracket tokens, usually a few hundred) and left out of the
precomputed mask; at run time a state's mask is its precomputed rows plus its trapped tokens
checked by walking the stack machine, cached per state id.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tgix.grammar.automaton import DEAD, ByteDFA, build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.index import FINISHED, TokenIndex
from tgix.grammar.json_any import NESTED, container_tree
from tgix.grammar.options import GrammarOptions

OPEN = (ord("{"), ord("["))
MAX_DEPTH = 512  # containers open at once; past it a generation may only close them
MAX_CONFIGS = 64  # configurations one state may hold (ambiguity is rare and short-lived)
_ADVANCE_CACHE = 1 << 16  # (state, token) -> state entries kept per grammar
_MASK_CACHE = 1024  # computed masks kept per grammar ([W] uint32 each: 6 KiB at V = 49152)


# A generation state: a schema state with an empty stack (int, FINISHED included), or a
# frozenset of configurations (state, stack of resume states).
State = int | frozenset


@dataclass(frozen=True, slots=True)
class Nesting:
    """calls [N] int32: per combined state, the state after a nested container (-1: none);
    outer: S, the number of schema states; g_start / g_final: G's start and final states."""

    calls: np.ndarray
    outer: int
    g_start: int
    g_final: int

    def pack(self) -> np.ndarray:
        return np.concatenate([[self.outer, self.g_start, self.g_final], self.calls]).astype(
            np.int32
        )

    @classmethod
    def unpack(cls, packed: np.ndarray) -> Nesting:
        return cls(packed[3:], int(packed[0]), int(packed[1]), int(packed[2]))


def has_nesting(dfa: ByteDFA) -> bool:
    return bool((dfa.table[:, NESTED] != DEAD).any())


@functools.lru_cache(maxsize=8)
def container_dfa(options: GrammarOptions) -> ByteDFA:
    """G for this layout: the same for every schema, so built once per options."""
    return build_dfa(container_tree(options), options.max_states)


def combine(outer: ByteDFA, options: GrammarOptions) -> tuple[ByteDFA, Nesting]:
    """One table for the schema automaton and G; NESTED edges become `calls`."""
    container = container_dfa(options)
    s = outer.num_states
    inner = np.where(container.table != DEAD, container.table + s, DEAD)
    table = np.vstack([outer.table, inner]).astype(np.int32)
    calls = table[:, NESTED].copy()
    table[:, NESTED] = DEAD
    accepting = np.concatenate([outer.accepting, np.zeros(container.num_states, dtype=bool)])
    final = s + int(np.flatnonzero(container.accepting)[0])
    return ByteDFA(table, accepting), Nesting(calls, s, s, final)


def trapped_dfa(real: ByteDFA, nesting: Nesting) -> tuple[ByteDFA, int, tuple[int, ...]]:
    """The table the token index walks: pushes and pops lead to a trap state (which loops on
    every byte); plus the states resumed after a push or pop, to index as seeds."""
    table = real.table.copy()
    trap = table.shape[0]
    table[table == nesting.g_final] = trap
    table[nesting.g_final] = trap  # unreachable now; "live" for the index's checks
    callers = np.flatnonzero(nesting.calls != DEAD)
    table[np.ix_(callers, OPEN)] = trap
    table = np.vstack([table, np.full((1, 256), trap, dtype=np.int32)])
    seeds = {int(real.table[nesting.g_start, b]) for b in OPEN}
    seeds |= set(nesting.calls[callers].tolist())
    seeds.discard(DEAD)
    return ByteDFA(table, np.append(real.accepting, False)), trap, tuple(sorted(seeds))


def walk(table: np.ndarray, nesting: Nesting, configs: frozenset, data: bytes) -> frozenset:
    """The configurations (state, stack) after `data` from `configs` (empty: no fit)."""
    calls = nesting.calls
    return walk_steps(lambda q, b: int(table[q, b]), calls.__getitem__, nesting, configs, data)


def walk_steps(step, call, nesting, configs: frozenset, data: bytes) -> frozenset:
    """`walk` over any automaton: step(q, byte) -> state, then call(q) -> the state after a
    nested container from q (DEAD: none); nesting: anything with g_start / g_final (a
    Nesting, a lazy_dfa.LazyDFA)."""
    start, final = nesting.g_start, nesting.g_final
    for b in data:
        out = set()
        for q, stack in configs:
            n = step(q, b)
            if n == final:
                out.add((stack[-1], stack[:-1]))
            elif n != DEAD:
                out.add((n, stack))
            if (b == 0x7B or b == 0x5B) and call(q) != DEAD and len(stack) < MAX_DEPTH:
                out.add((step(start, b), (*stack, int(call(q)))))
        if len(out) > MAX_CONFIGS:
            raise GrammarError("grammar too ambiguous to track at run time")
        configs = frozenset(out)
        if not configs:
            break
    return configs


def accepts(real: ByteDFA, nesting: Nesting, data: bytes) -> bool:
    """Whether the stack machine accepts `data` (an empty stack in an accepting state)."""
    ends = walk(real.table, nesting, frozenset({(0, ())}), data)
    return any(not stack and real.accepting[q] for q, stack in ends)


class PushdownIndex:
    """TokenIndex's interface over the stack machine; `base` is the index of the trapped
    table (its rows: the precomputed part of every mask)."""

    def __init__(self, base: TokenIndex, real: ByteDFA, nesting: Nesting):
        self.base, self.nesting = base, nesting
        self.table, self.calls = real.table, nesting.calls
        self.accepting = real.accepting
        self.start = 0
        self.vocab, self.eos_ids, self.stats = base.vocab, base.eos_ids, base.stats
        self._masks: OrderedDict[State, np.ndarray] = OrderedDict()
        self._next: dict[tuple[State, int], State] = {}

    @property
    def num_states(self) -> int:
        return self.base.num_states

    @property
    def width(self) -> int:
        return self.base.width

    # -- the stack machine ----------------------------------------------------------------

    def walk(self, configs: frozenset, data: bytes) -> frozenset:
        """The configurations after `data` (empty: it does not fit)."""
        return walk(self.table, self.nesting, configs, data)

    def configurations(self, state: State) -> frozenset:
        if isinstance(state, int):
            return frozenset({(state, ())})
        return state

    @staticmethod
    def state_of(configs: frozenset) -> State:
        """A schema state with an empty stack as its int (the precomputed path), else the
        configurations themselves (hashable; nothing to intern, so nothing grows)."""
        if len(configs) == 1:
            ((q, stack),) = configs
            if not stack:
                return q
        return configs

    # -- TokenIndex's interface -----------------------------------------------------------

    def _precomputed(self, state: State) -> bool:
        return isinstance(state, int) and state not in self.base.trapped

    def mask(self, state: State) -> np.ndarray:
        if state == FINISHED or self._precomputed(state):
            return self.base.mask(state)
        words = self._masks.get(state)
        if words is None:
            words = self._masks[state] = self._compute(state)
            if len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return words

    def _compute(self, state: State) -> np.ndarray:
        words = np.zeros(self.width, dtype=np.uint32)
        token_bytes = self.vocab.token_bytes
        for q, stack in self.configurations(state):
            row = self.base.row_of[q] if q < len(self.base.row_of) else -1
            if row < 0:  # a state no whole-token walk reached while indexing: walk them all
                ids = range(self.vocab.size)
            else:
                words |= self.base.masks[row]
                ids = self.base.trapped.get(q, ())
            for t in ids:
                if token_bytes[t] and self.walk(frozenset({(q, stack)}), token_bytes[t]):
                    words[t >> 5] |= np.uint32(1 << (t & 31))
        return words

    def is_accepting(self, state: State) -> bool:
        if state == FINISHED:
            return True
        return any(not stack and self.accepting[q] for q, stack in self.configurations(state))

    def allows(self, state: State, token_id: int) -> bool:
        return bool((int(self.mask(state)[token_id >> 5]) >> (token_id & 31)) & 1)

    def advance(self, state: State, token_id: int) -> State:
        """The state after `token_id`; FINISHED after EOS; GrammarError if not allowed."""
        key = (state, token_id)
        nxt = self._next.get(key)
        if nxt is not None:
            return nxt
        if len(self._next) >= _ADVANCE_CACHE:  # a cache only: states carry their own stack
            self._next.clear()
        if not self.allows(state, token_id):
            raise GrammarError(f"token {token_id} is not allowed in state {state}")
        if token_id in self.eos_ids:
            nxt = FINISHED
        elif self._precomputed(state):
            nxt = self.base.advance(state, token_id)
        else:
            configs = self.walk(self.configurations(state), self.vocab.token_bytes[token_id])
            nxt = self.state_of(configs)
        self._next[key] = nxt
        return nxt

    def forced_token(self, state: State) -> int | None:
        if state == FINISHED:
            return None
        if self._precomputed(state):
            return self.base.forced_token(state)
        words = self.mask(state)
        if int(np.bitwise_count(words).sum()) != 1:
            return None
        token = int(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0])
        return None if token in self.eos_ids else token
