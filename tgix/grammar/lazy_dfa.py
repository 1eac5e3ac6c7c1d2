"""A byte automaton determinised on demand: the rows generation reaches, nothing more.

The eager pipeline (automaton.build_dfa) runs the subset construction over the whole NFA and
minimises it before a request can start, which costs seconds on large schemas. Here the NFA is
built as there (nfa.build: linear in the schema), and a DFA state, a set of NFA states, gets
its row of 256 successors the first time a walk asks for it. States are numbered in discovery
order (start 0); a row is the same function of its state set as in the eager construction, so
both automata accept exactly the same bytes (they differ only in numbering and minimality).

- Intersections and differences (and `atomic` one-part intersections, json_common.atomic:
  a minimisation hint for the eager build) are called, not copied: the NFA has an entry and
  an exit for each use, and the node's own automaton (a LazyDFA, or a lazy_product pair
  automaton) is built once per grammar and stepped inside the set states.
- NFA states that cannot reach the exit are left out of every set, so every state but DEAD
  can still reach acceptance (the masks' liveness rule needs no search).
- With nesting (tgix.grammar.pushdown), the NESTED byte's column moves to `calls` and the
  container automaton G's states join the same numbering as ("g", state) keys.

Budgets: `max_states` DFA states per grammar (every request on it shares them), and the
deadline in `self.deadline`, which the caller sets before each batch of work.
"""

from __future__ import annotations

import numpy as np

from tgix.grammar import regex_tree as rt
from tgix.grammar.automaton import DEAD, ByteDFA
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_any import NESTED
from tgix.grammar.lazy_inline import MAX_COPIES, inlined_atomics, repeat_copies
from tgix.grammar.lazy_shared import COMMON, Shared, empty_or_raise
from tgix.grammar.nfa import Nfa, build, check_deadline

UNKNOWN = -2  # a row not computed yet
SHARED_LEAF_CHARS = 24  # regex leaves longer than this get one automaton per grammar


class LazyDFA:
    """table [capacity, 256] int32 (UNKNOWN rows not computed; read through `row`),
    accepting [capacity] bool, token_live [capacity + 1] bool (index -1, DEAD: False),
    calls [capacity] int32 (pushdown only: the state after a nested container, DEAD for
    none). `start` is 0.

    A set state holds NFA states (ints) and, for each `atomic` node the NFA calls, (entry, q)
    pairs: the node's own LazyDFA (built once per node, shared by every place that uses it)
    in its state q, resuming at the NFA state after that call when it accepts. This keeps the
    NFA linear in the schema where copies of an object (`x (, x)*`, counted repeats) would
    multiply it."""

    start = 0

    def __init__(
        self,
        node: rt.Node,
        max_states: int,
        deadline: float,
        container=None,
        singles=None,
        shared: Shared | None = None,
    ):
        """container: a zero-argument callable giving G (pushdown.container_dfa), called only
        when the automaton reads NESTED (top level only). singles [256] bool: the bytes the
        vocabulary has as one-byte tokens; `token_live[s]`: s reaches acceptance through
        them alone (what a token mask may lead to)."""
        self.shared = shared = shared or Shared(max_states, deadline, singles)
        nfa = _CallingNfa(self)
        self.calls_into: dict[int, _Call] = {}

        if isinstance(node, rt.Regex | rt.RawByte):
            entry, exit_ = build(nfa, node, None)
        else:
            self._inline = inlined_atomics(node)
            entry, exit_ = self._build(nfa, node)
        self._setup(nfa.eps, nfa.edges, entry, exit_, container)

    def _build(self, nfa: _CallingNfa, node: rt.Node) -> tuple[int, int]:
        """nfa.build, calling what it would copy: products, and regex leaves long enough
        to be worth an automaton of their own (one per distinct leaf in the grammar); an
        `atomic` node built only once is inlined (lazy_inline)."""
        if isinstance(node, rt.Both) and id(node) in self._inline:
            return self._build(nfa, node.parts[0])
        if isinstance(node, rt.Both | rt.Minus):
            return nfa.call(self._machine(node), 1, 1)
        if isinstance(node, rt.Regex) and len(node.source) > SHARED_LEAF_CHARS:
            return nfa.call(self._part(node), 1, 1)
        if isinstance(node, rt.Seq):
            return nfa.chain([self._build(nfa, p) for p in node.parts])
        if isinstance(node, rt.Alt):
            return nfa.union([self._build(nfa, p) for p in node.options])
        if isinstance(node, rt.Repeat):
            return nfa.repeat(lambda: self._build(nfa, node.node), node.lo, node.hi)
        return build(nfa, node, None)

    @classmethod
    def _of_fragment(cls, eps, edges, calls_into, entry: int, exit_: int, shared) -> LazyDFA:
        """The automaton of an NFA fragment built apart (a counted repeat's body)."""
        self = cls.__new__(cls)
        self.shared, self.calls_into = shared, calls_into
        self._setup(eps, edges, entry, exit_, None)
        return self

    def _setup(self, eps, edges, entry: int, exit_: int, container) -> None:
        shared = self.shared
        self.eps, self.edges, self.exit = eps, edges, exit_
        calls = {u: (True, c.exit) for u, c in self.calls_into.items()}
        self.live = _coreachable(eps, edges, exit_, calls)
        calls = {u: (c.startable(), c.exit) for u, c in self.calls_into.items()}
        self.single_live = _coreachable(eps, edges, exit_, calls, shared.singles)
        self.reads_nested = _reads_nested(edges) or any(
            c.machine.reads_nested for c in self.calls_into.values()
        )
        self.nested = container is not None and self.reads_nested
        self.container: ByteDFA | None = container() if self.nested else None
        self._closures: dict[int, frozenset] = {}
        self._closed: dict[frozenset, frozenset] = {}
        self.keys: list = []
        self.ids: dict = {}
        self.table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self.accepting = np.zeros(64, dtype=bool)
        self.token_live = np.zeros(65, dtype=bool)
        self.calls = np.full(64, DEAD, dtype=np.int32)
        if self._intern(self._closure(entry)) != 0:
            raise GrammarError("the grammar matches no string at all")
        if self.nested:
            g_final = int(np.flatnonzero(self.container.accepting)[0])
            self.g_start, self.g_final = self._intern(("g", 0)), self._intern(("g", g_final))

    def _machine(self, node: rt.Node):
        """The shared automaton of an intersection or difference node (a one-part
        intersection, json_common.atomic, is its part's own LazyDFA; others a LazyProduct);
        None: its language is empty."""
        found, machine = self.shared.machines.find(node)
        if not found:
            try:
                machine = self._new_machine(node)
            except GrammarError as exc:
                machine = empty_or_raise(exc)
            self.shared.machines.put(node, machine)
        return machine

    def _new_machine(self, node: rt.Node):
        from tgix.grammar.lazy_product import LazyProduct

        if isinstance(node, rt.Minus):
            keep, drop = self._part(node.keep), self._part(node.drop)
            if keep is None:
                raise GrammarError("the grammar matches no string at all")
            return keep if drop is None else LazyProduct(keep, drop, False, self.shared)
        if isinstance(node, rt.Both):
            parts = [self._part(p) for p in node.parts]
            if any(p is None for p in parts):
                raise GrammarError("the grammar matches no string at all")
            result = parts[0]
            for other in parts[1:]:
                result = LazyProduct(result, other, True, self.shared)
            return result
        raise GrammarError(f"unknown grammar node {type(node).__name__}")

    def _part(self, node: rt.Node):
        """A side of a product, or a called leaf: its own automaton (one per node in the
        grammar, and one per process for nodes that other grammars use too, see
        lazy_shared), None when empty."""
        if isinstance(node, rt.Both | rt.Minus):
            return self._machine(node)
        shared = self.shared
        found, machine = shared.machines.find(node)
        if not found:
            found, value = COMMON.lookup(node, shared.singles, shared.max_states)
            if found:
                machine = value
            else:
                share = value  # an earlier grammar used it: build it for all
                owner = Shared(shared.max_states, float("inf"), shared.singles) if share else shared
                try:
                    machine = LazyDFA(node, 0, 0.0, shared=owner)
                except GrammarError as exc:
                    machine = empty_or_raise(exc)
                if share:
                    machine = COMMON.store(node, shared.singles, shared.max_states, machine)
            shared.machines.put(node, machine)
        return machine

    @property
    def deadline(self) -> float:
        return self.shared.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.shared.deadline = value

    @property
    def num_states(self) -> int:
        return len(self.keys)

    def row(self, state: int) -> np.ndarray:
        """[256] int32 successors of `state` (computed now if needed)."""
        if self.table[state, 0] == UNKNOWN:
            with self.shared.lock:  # a common automaton: another thread may be here
                if self.table[state, 0] == UNKNOWN:
                    self._compute(state)
        return self.table[state]

    def ensure(self, states: np.ndarray) -> None:
        """Compute the rows of `states` [n] that are still unknown."""
        missing = states[self.table[states, 0] == UNKNOWN]
        for s in np.unique(missing).tolist():
            self.row(s)

    def step(self, state: int, byte: int) -> int:
        nxt = int(self.table[state, byte])
        return nxt if nxt != UNKNOWN else int(self.row(state)[byte])

    def walk(self, data: bytes, state: int = 0) -> int:
        for b in data:
            if state == DEAD:
                break
            state = self.step(state, b)
        return state

    # -- construction -------------------------------------------------------------------

    def _closure(self, u: int) -> frozenset:
        """u's epsilon closure: NFA states that read a byte or are the exit, and live, and
        (entry, 0, 0) for each call entered (its callee at its start, no body done yet),
        through to the call's exit where it may read nothing."""
        found = self._closures.get(u)
        if found is None:
            seen, todo, keep = {u}, [u], set()
            while todo:
                t = todo.pop()
                call = self.calls_into.get(t)
                nxt = list(self.eps[t])
                if call is not None and self.live(call.exit):
                    if call.hi is None or call.hi > 0:
                        keep.add((t, 0, 0))
                    if call.least() == 0:
                        nxt.append(call.exit)
                elif (self.edges[t] or t == self.exit) and self.live(t):
                    keep.add(t)
                for v in nxt:
                    if v not in seen:
                        seen.add(v)
                        todo.append(v)
            found = self._closures[u] = frozenset(keep)
        return found

    def _intern(self, key) -> int:
        if not key:
            return DEAD
        found = self.ids.get(key)
        if found is not None:
            return found
        n, shared = len(self.keys), self.shared
        shared.states += 1
        if shared.states > shared.max_states:
            raise GrammarError(
                f"grammar too large (more than {shared.max_states} automaton states)"
            )
        if shared.states % 64 == 0:
            check_deadline(shared.deadline)
        if n == len(self.accepting):
            self._grow()
        self.ids[key] = n
        self.keys.append(key)
        is_set = isinstance(key, frozenset)
        self.accepting[n] = is_set and self.exit in key
        self.token_live[n] = not is_set or any(self._token_live(e) for e in key)
        return n

    def _token_live(self, element) -> bool:
        if isinstance(element, tuple):
            entry, done, q = element
            call = self.calls_into[entry]
            more = done + 1 >= call.least() or call.startable()
            return bool(call.machine.token_live[q]) and more and self.single_live(call.exit)
        return self.single_live(element)

    def _grow(self) -> None:
        size = 2 * len(self.accepting)
        table = np.full((size, 256), UNKNOWN, dtype=np.int32)
        table[: len(self.table)] = self.table
        self.table = table
        self.accepting = np.concatenate([self.accepting, np.zeros(size // 2, dtype=bool)])
        live = np.zeros(size + 1, dtype=bool)
        live[: size // 2] = self.token_live[: size // 2]
        self.token_live = live
        self.calls = np.concatenate([self.calls, np.full(size // 2, DEAD, dtype=np.int32)])

    def _compute(self, state: int) -> None:
        key = self.keys[state]
        row = np.full(256, DEAD, dtype=np.int32)
        if isinstance(key, tuple):  # a state of the container automaton G
            g_row = self.container.table[key[1]]
            for g in np.unique(g_row[g_row != DEAD]).tolist():
                row[g_row == g] = self._intern(("g", g))
        else:
            spans = [e for u in key if isinstance(u, int) for e in self.edges[u]]
            inner = [
                (u, self.calls_into[u[0]].machine.row(u[2])) for u in key if isinstance(u, tuple)
            ]
            if len(spans) == 1 and not inner:
                lo, hi, t = spans[0]
                row[lo : hi + 1] = self._intern(self._closure(t))
            elif spans or inner:
                cuts = {lo for lo, _, _ in spans} | {hi + 1 for _, hi, _ in spans} | {0, 256}
                for _, r in inner:
                    cuts.update((np.flatnonzero(np.diff(r)) + 1).tolist())
                cuts = sorted(cuts)
                for a, b in zip(cuts, cuts[1:], strict=False):
                    moved = frozenset(t for lo, hi, t in spans if lo <= a <= hi)
                    calls = frozenset((*u[:2], int(r[a])) for u, r in inner if r[a] != DEAD)
                    if moved or calls:
                        row[a:b] = self._intern(self._closed_set(moved, calls))
        if self.nested:
            self.calls[state] = row[NESTED]
            row[NESTED] = DEAD
        self.table[state] = row  # may have grown meanwhile: index after interning

    def _closed_set(self, moved: frozenset, calls: frozenset) -> frozenset:
        key = (moved, calls)
        found = self._closed.get(key)
        if found is None:
            parts = [self._closure(t) for t in moved]
            for entry, done, q in calls:
                call = self.calls_into[entry]
                parts.append(frozenset({(entry, done, q)}))
                if call.machine.accepting[q]:  # a body complete: leave, or start the next
                    n = done + 1
                    if n >= call.least():
                        parts.append(self._closure(call.exit))
                    if call.hi is None or n < call.hi:
                        again = min(n, call.lo) if call.hi is None else n
                        parts.append(frozenset({(entry, again, 0)}))
            found = self._closed[key] = frozenset().union(*parts)
        return found


class _Call:
    """An NFA entry that runs `machine` lo..hi times (hi None: unbounded), then `exit`."""

    __slots__ = ("machine", "exit", "lo", "hi")

    def __init__(self, machine, exit_: int, lo: int, hi: int | None):
        self.machine, self.exit, self.lo, self.hi = machine, exit_, lo, hi

    def least(self) -> int:
        """Bodies needed (0 when one body may be empty: fewer bodies then do)."""
        return 0 if self.machine.accepting[0] else self.lo

    def startable(self) -> bool:
        """Can the call finish through one-byte tokens (what token liveness needs)?"""
        return self.least() == 0 or bool(self.machine.token_live[0])


class _CallingNfa(Nfa):
    """The NFA of one LazyDFA: calls instead of copies. A repeat that would copy its body
    more than twice builds the body once, apart, as its own automaton, and counts."""

    def __init__(self, owner: LazyDFA):
        super().__init__(owner.shared.max_states, owner.shared.deadline)
        self.owner = owner

    def call(self, machine, lo: int, hi: int | None) -> tuple[int, int]:
        entry, exit_ = self.new(), self.new()
        if machine is not None:
            self.owner.calls_into[entry] = _Call(machine, exit_, lo, hi)
        elif lo == 0:
            self.eps[entry].append(exit_)
        return entry, exit_

    def repeat(self, build, lo: int, hi: int | None):
        if repeat_copies(lo, hi) <= MAX_COPIES:
            return super().repeat(build, lo, hi)
        if hi is not None and hi < lo:
            raise GrammarError(f"invalid regex repetition {{{lo},{hi}}}: max below min")
        owner = self.owner
        saved = self.eps, self.edges, owner.calls_into
        self.eps, self.edges, owner.calls_into = [], [], {}
        try:
            entry, exit_ = build()
        finally:
            body = self.eps, self.edges, owner.calls_into
            self.eps, self.edges, owner.calls_into = saved
        try:
            machine = LazyDFA._of_fragment(*body, entry, exit_, owner.shared)
        except GrammarError as exc:
            machine = empty_or_raise(exc)
        return self.call(machine, lo, hi)


def _reads_nested(edges: list) -> bool:
    return any(hi >= NESTED for out in edges for _, hi, _ in out)


def _coreachable(eps: list, edges: list, exit_: int, calls: dict, usable=None):
    """A predicate: can NFA state u reach the exit, reading only bytes where `usable` [256]
    (default: any byte)? calls: entry -> (callee's start is live, exit) (the call counts as
    an edge when its callee can finish). Thompson fragments always can, unless some leaf
    matches nothing (an empty class: a state with no way out) or some edge or call reads
    only unusable bytes; only then is the reverse search run. NESTED counts as usable."""
    usable = np.ones(256, dtype=bool) if usable is None else usable.copy()
    usable[NESTED] = True
    prefix = [0, *np.cumsum(usable).tolist()]  # a list: ok() runs once per edge

    def ok(lo: int, hi: int) -> bool:
        return prefix[hi + 1] > prefix[lo]

    sinks = [
        u
        for u, (e, d) in enumerate(zip(eps, edges, strict=True))
        if not e and not d and not (u in calls and calls[u][0])
    ]
    blocked = not usable.all() and not all(
        ok(lo, hi) for lo, hi in {(lo, hi) for out in edges for lo, hi, _ in out}
    )
    if sinks == [exit_] and not blocked:
        return lambda u: True
    preds: list[list[int]] = [[] for _ in eps]
    for u, (e, d) in enumerate(zip(eps, edges, strict=True)):
        for v in e:
            preds[v].append(u)
        for lo, hi, v in d:
            if ok(lo, hi):
                preds[v].append(u)
    for u, (callee_live, x) in calls.items():
        if callee_live:
            preds[x].append(u)
    live = np.zeros(len(eps), dtype=bool)
    live[exit_] = True
    todo = [exit_]
    while todo:
        for p in preds[todo.pop()]:
            if not live[p]:
                live[p] = True
                todo.append(p)
    return lambda u: bool(live[u])
