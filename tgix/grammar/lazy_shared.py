"""What lazily built automata share: within a grammar, and across grammars.

Within one grammar (`Shared`): the deadline the caller sets before each batch of work, the
state budget every automaton of the grammar draws on, and its called sub-automata by node
(an intersection used twice is built once).

Across grammars (`COMMON`): the sub-automata of nodes that many schemas repeat, keyed by the
node itself (structural equality) and what changes their rows (the vocabulary's one-byte
tokens, the state budget). A node is shared from the second grammar that uses it on (a
schema's own objects stay with their grammar and go when it goes). An unconstrained value
(`{}`, open `additionalProperties`), a string body or a number is then determinised once per
process instead of once per schema: about a third of a typical schema's first-mask time
went to rebuilding them. Such an automaton has
its own `Shared` (no deadline: its work per row is bounded by its own budget) and is filled
in by whichever grammar reaches a row first, from the compile thread or the engine thread:
rows are computed under its lock, read without it (a row is published after the states it
names exist).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from tgix.grammar.errors import GrammarError

COMMON_MACHINES = 512  # sub-automata kept across grammars (least recently used dropped)


class Shared:
    """One grammar's (or one common automaton's) deadline, state budget and sub-automata."""

    def __init__(self, max_states: int, deadline: float, singles):
        self.max_states, self.deadline, self.states = max_states, deadline, 0
        self.singles = singles
        self.machines: dict = {}
        self.lock = threading.RLock()


def unless_empty(build: Callable):
    """build(), or None where the node's language is empty (the caller then treats the
    call as reading nothing)."""
    try:
        return build()
    except GrammarError as exc:
        if "matches no string" not in str(exc):
            raise
        return None


class CommonMachines:
    """node-keyed automata shared by every grammar of the process, least recently used
    dropped past `capacity` (grammars holding one keep it)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._machines: OrderedDict = OrderedDict()
        self._seen: OrderedDict = OrderedDict()  # keys some grammar built for itself
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, node, singles, max_states: int, build: Callable[[Shared], object], own):
        """The automaton of `node` (None: empty language): built by build(Shared) once for
        all grammars when an earlier grammar used it too, else own() (this grammar's)."""
        key = (node, None if singles is None else singles.tobytes(), max_states)
        with self._lock:
            if key in self._machines:
                self.hits += 1
                self._machines.move_to_end(key)
                return self._machines[key]
            first = key not in self._seen
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > 8 * self.capacity:
                self._seen.popitem(last=False)
        if first:
            return unless_empty(own)
        machine = unless_empty(lambda: build(Shared(max_states, float("inf"), singles)))
        with self._lock:
            self.misses += 1
            machine = self._machines.setdefault(key, machine)  # a racing build loses
            while len(self._machines) > self.capacity:
                self._machines.popitem(last=False)
        return machine

    def clear(self) -> None:
        with self._lock:
            self._machines.clear()
            self._seen.clear()


COMMON = CommonMachines(COMMON_MACHINES)
