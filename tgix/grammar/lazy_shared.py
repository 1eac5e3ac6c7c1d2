"""What lazily built automata share: within a grammar, and across grammars.

Within one grammar (`Shared`): the deadline the caller sets before each batch of work, the
state budget every automaton of the grammar draws on, and its called sub-automata by node
(an intersection used twice is built once).

Across grammars (`COMMON`): the sub-automata of nodes that many schemas repeat, keyed by the
node's content (its hash, confirmed by a digest) and what changes their rows (the
vocabulary's one-byte tokens, the state budget). A node is shared from the second grammar
that uses it on (a schema's own objects stay with their grammar and go when it goes). An
unconstrained value (`{}`, open `additionalProperties`), a string body or a number is then
determinised once per process instead of once per schema: about a third of a typical
schema's first-mask time went to rebuilding them. Such an automaton has its own `Shared`
(no deadline: its work per row is bounded by its own budget) and is filled in by whichever
grammar reaches a row first, from the compile thread or the engine thread: rows are
computed under its lock, read without it (a row is published after the states it names
exist).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from tgix.grammar.errors import GrammarError
from tgix.grammar.regex_tree import digest

COMMON_MACHINES = 512  # sub-automata kept across grammars (least recently used dropped)


class NodeMap:
    """node -> value, found by the node's cached structural hash and confirmed by identity
    or, for an equal-looking node built elsewhere, by regex_tree.digest (never `==`, which on
    two equal but distinct trees walks every path). The digest is computed only on a hash
    hit, so a grammar's own nodes never pay it."""

    def __init__(self):
        self._by_hash: dict[int, list[tuple[object, object]]] = {}

    def find(self, node) -> tuple[bool, object]:
        for other, value in self._by_hash.get(hash(node), ()):
            if other is node or digest(other) == digest(node):
                return True, value
        return False, None

    def put(self, node, value) -> None:
        self._by_hash.setdefault(hash(node), []).append((node, value))

    def values(self) -> list:
        return [v for entries in self._by_hash.values() for _, v in entries]


class Shared:
    """One grammar's (or one common automaton's) deadline, state budget and sub-automata."""

    def __init__(self, max_states: int, deadline: float, singles):
        self.max_states, self.deadline, self.states = max_states, deadline, 0
        self.singles = singles
        self.machines = NodeMap()
        self.lock = threading.RLock()


def empty_or_raise(exc: GrammarError) -> None:
    """None (the node's language is empty: the caller treats it as reading nothing) for
    that error, else raise it. Called from the caller's own `except`, so a deeply nested
    schema's recursion holds no extra frames per level."""
    if "matches no string" not in str(exc):
        raise exc
    return None


class CommonMachines:
    """node-keyed automata shared by every grammar of the process, least recently used
    dropped past `capacity` (grammars holding one keep it)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._machines: OrderedDict = OrderedDict()
        self._seen: OrderedDict = OrderedDict()  # keys some grammar built for itself
        self._lock = threading.Lock()

    def lookup(self, node, singles, max_states: int) -> tuple[bool, object]:
        """(True, the shared automaton or None for an empty language), or (False, share):
        not built for all yet; share is True when an earlier grammar used the node too
        (build it with its own `Shared` and `store` it), False the first time (build it
        for the caller's grammar alone)."""
        key = _key(node, singles, max_states)
        with self._lock:
            entry = self._machines.get(key)
            if entry is not None and (entry[0] is node or digest(entry[0]) == digest(node)):
                self._machines.move_to_end(key)
                return True, entry[1]
            share = key in self._seen  # (a hash collision here only shares a node early)
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > 8 * self.capacity:
                self._seen.popitem(last=False)
            return False, share

    def store(self, node, singles, max_states: int, machine):
        """Keep `machine` for every grammar; returns the one kept (a racing build loses)."""
        key = _key(node, singles, max_states)
        with self._lock:
            entry = self._machines.get(key)
            if entry is not None and digest(entry[0]) == digest(node):
                return entry[1]
            self._machines[key] = (node, machine)
            while len(self._machines) > self.capacity:
                self._machines.popitem(last=False)
        return machine

    def names(self) -> set[bytes]:
        """The digests of the nodes kept (tests)."""
        with self._lock:
            return {digest(node) for node, _ in self._machines.values()}

    def clear(self) -> None:
        with self._lock:
            self._machines.clear()
            self._seen.clear()


def _key(node, singles, max_states: int) -> tuple:
    return hash(node), None if singles is None else singles.tobytes(), max_states


COMMON = CommonMachines(COMMON_MACHINES)
