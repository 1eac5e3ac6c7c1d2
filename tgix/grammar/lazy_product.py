"""Intersections and differences built on demand (the lazy counterpart of automaton._pair).

A state is a pair (a, b) of the two sides' LazyDFA states (b may be DEAD in a difference:
the subtracted side has died, so everything `a` accepts from there is kept). Rows are
computed as generation reaches them, like LazyDFA's. Unlike a set state, a pair can be a
dead end although both sides are alive (a pattern that needs more characters than maxLength
leaves), so a pair is only interned once a breadth-first search over pairs has found an
accepting pair from it; the search's path is remembered as live, a search that runs out
marks everything it saw dead. That is what the eager construction's minimisation prunes,
found only for the pairs generation reaches.
"""

from __future__ import annotations

import numpy as np

from tgix.grammar.automaton import DEAD
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_any import NESTED
from tgix.grammar.nfa import check_deadline


class LazyProduct:
    """Both sides' languages (keep_second) or the first minus the second, with LazyDFA's
    reading interface: row(q) [256], accepting [q], token_live [q], reads_nested."""

    def __init__(self, a, b, keep_second: bool, shared):
        self.a, self.b, self.keep_second, self.shared = a, b, keep_second, shared
        self.reads_nested = a.reads_nested or b.reads_nested
        self.keys: list[tuple[int, int]] = []
        self.ids: dict[tuple[int, int], int] = {}
        self.rows: list[np.ndarray | None] = []
        self.accepting = np.zeros(64, dtype=bool)
        self.token_live = np.zeros(65, dtype=bool)
        self._live: dict[tuple[int, int], bool] = {}
        self._token_live: dict[tuple[int, int], bool] = {}
        self._all = np.ones(256, dtype=bool)
        self._singles = self._all if shared.singles is None else shared.singles.copy()
        self._singles[NESTED] = True  # a nested container: spelled by single bytes too
        if self._intern((0, 0)) != 0:
            raise GrammarError("the grammar matches no string at all")

    def row(self, q: int) -> np.ndarray:
        found = self.rows[q]
        if found is None:
            with self.shared.lock:  # a side of a common automaton (lazy_shared)
                found = self.rows[q]
                if found is None:
                    found = self.rows[q] = self._compute(q)
        return found

    # -- pairs ----------------------------------------------------------------------------

    def _accepts(self, pair: tuple[int, int]) -> bool:
        qa, qb = pair
        b_accepts = qb != DEAD and bool(self.b.accepting[qb])
        return bool(self.a.accepting[qa]) and (b_accepts if self.keep_second else not b_accepts)

    def _successors(self, pair: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """[256] successor pair per byte as (a states, b states); a = DEAD where none."""
        qa, qb = pair
        ra = self.a.row(qa)
        rb = self.b.row(qb) if qb != DEAD else np.full(256, DEAD, dtype=np.int32)
        if self.keep_second:
            ra = np.where(rb == DEAD, DEAD, ra)
        return ra, rb

    def _search(self, pair: tuple[int, int], usable: np.ndarray, memo: dict) -> bool:
        """Whether some string over `usable` bytes leads `pair` to acceptance."""
        if pair in memo:
            return memo[pair]
        parent = {pair: None}
        todo, found = [pair], None
        while todo and found is None:
            nxt = []
            for p in todo:
                if memo.get(p) or self._accepts(p):
                    found = p
                    break
                if len(parent) > self.shared.max_states:
                    raise GrammarError("grammar too large (a product's search ran out)")
                if len(parent) % 256 == 0:
                    check_deadline(self.shared.deadline)
                ra, rb = self._successors(p)
                ok = usable & (ra != DEAD)
                for qa, qb in set(zip(ra[ok].tolist(), rb[ok].tolist(), strict=True)):
                    q = (qa, qb)
                    if q not in parent and memo.get(q) is not False:
                        parent[q] = p
                        nxt.append(q)
            todo = nxt
        if found is None:
            memo.update(dict.fromkeys(parent, False))
            return False
        while found is not None:
            memo[found] = True
            found = parent[found]
        return True

    def _intern(self, pair: tuple[int, int]) -> int:
        found = self.ids.get(pair)
        if found is not None:
            return found
        if not self._search(pair, self._all, self._live):
            return DEAD
        shared = self.shared
        shared.states += 1
        if shared.states > shared.max_states:
            raise GrammarError(
                f"grammar too large (more than {shared.max_states} automaton states)"
            )
        n = len(self.keys)
        if n == len(self.accepting):
            self.accepting = np.concatenate([self.accepting, np.zeros(n, dtype=bool)])
            live = np.zeros(2 * n + 1, dtype=bool)
            live[:n] = self.token_live[:n]
            self.token_live = live
        self.ids[pair] = n
        self.keys.append(pair)
        self.rows.append(None)
        self.accepting[n] = self._accepts(pair)
        self.token_live[n] = self._search(pair, self._singles, self._token_live)
        return n

    def _compute(self, q: int) -> np.ndarray:
        ra, rb = self._successors(self.keys[q])
        row = np.full(256, DEAD, dtype=np.int32)
        alive = ra != DEAD
        if alive.any():
            codes = ra.astype(np.int64) * (1 << 32) + (rb.astype(np.int64) + 1)
            for code in np.unique(codes[alive]).tolist():
                pair = (code >> 32, (code & 0xFFFFFFFF) - 1)
                row[codes == code] = self._intern(pair)
        return row
