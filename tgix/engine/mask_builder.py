"""Grammar masks built off the engine thread (host only): the engine waits a bounded time.

A lazily built grammar (tgix.grammar.lazy_index) computes a state's token mask the first
time a row reaches it: a walk of the vocabulary's byte trie, ~1.5 ms p50 and tens of ms in
the tail on this machine. Built on the engine thread, that time is added to the step of every
row in the batch. Here it goes to one background thread instead:

    commit (a row's grammar moved to a new state)
        -> wait(grammar, state): submit the build, wait up to `budget_s`
        -> ready in time: the row decodes in the next step as before
        -> not ready: the row is held (RequestState.waiting_for_mask); the scheduler leaves it
           out of steps until the mask is there, the other rows go on; `on_ready` wakes the
           engine loop when a build ends (an idle loop waits on it).

Ahead builds (`ahead`, on beside an accelerator: ahead_from_env): once a demanded mask is
built, the states its allowed tokens lead to (when few: LazyTokenIndex.mask_and_successors)
are queued behind every demanded build, so the next token's mask is often ready before its
row asks (built while the device runs the step).

`budget_s = None` builds inline on the engine thread (the row never waits a step; the step
waits for it), which is what `MaskBuilder.inline()` gives. A failed build (the grammar's state
or time budget) is remembered by the grammar: the held row is released, and its mask call
raises at once, which ends that request alone with a grammar error (RequestState.token_mask).
Eagerly compiled grammars have every mask already (no `has_mask`): never held.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)
STOP, DEMANDED, AHEAD = -1, 0, 1  # queue priorities: close / a row waits / may reach it
MAX_QUEUED_AHEAD = 256  # ahead builds are queued only while the queue is shorter
DEFAULT_WAIT_MS = 5.0  # see benchmarks/grammar_mask_wait.py for the measured choice


def budget_from_env() -> float | None:
    """TGIX_GRAMMAR_MASK_WAIT_MS: how long the engine waits for a new state's mask before the
    row sits a step out ("inline": no thread, the step waits for the whole build)."""
    raw = os.environ.get("TGIX_GRAMMAR_MASK_WAIT_MS", "").strip().lower()
    if raw == "inline":
        return None
    ms = float(raw) if raw else DEFAULT_WAIT_MS
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"TGIX_GRAMMAR_MASK_WAIT_MS must be >= 0 or 'inline', not {raw!r}")
    return ms / 1000


def ahead_from_env(accelerator: bool) -> bool:
    """TGIX_GRAMMAR_MASK_AHEAD=1/0: build the states a new one leads to before rows ask.
    Default: only beside an accelerator. On XLA:CPU the builds take cores from the model's
    steps: measured slower for every row with them on (benchmarks/grammar_mask_wait.py);
    beside a GPU or TPU the host is idle while a step runs (not measured yet)."""
    raw = os.environ.get("TGIX_GRAMMAR_MASK_AHEAD", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"TGIX_GRAMMAR_MASK_AHEAD must be 0 or 1, not {raw!r}")
    return accelerator if raw == "" else raw == "1"


def has_mask(grammar, state) -> bool:
    """True when grammar.mask(state) returns without building (or the grammar has no lazy
    masks at all)."""
    check = getattr(grammar, "has_mask", None)
    return check is None or check(state)


class MaskBuilder:
    """One daemon thread building (grammar, state) masks in submission order."""

    def __init__(
        self,
        budget_s: float | None,
        on_ready: Callable[[], None] = lambda: None,
        *,
        ahead: bool = False,
    ):
        self.budget_s = budget_s
        self._on_ready = on_ready
        self.ahead = ahead
        # (priority, order, key, grammar, state): demanded builds first, then ahead ones
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._pending: dict[tuple[int, object], threading.Event] = {}
        self._order = 0
        self._lock = threading.Lock()
        # the engine thread's wait per call, the last 65536 (benchmarks read and clear it)
        self.waited_s: collections.deque[float] = collections.deque(maxlen=1 << 16)
        self.held = 0  # rows left out of a step for a mask (counted by the engine)
        self._thread: threading.Thread | None = None
        if budget_s is not None:
            self._thread = threading.Thread(target=self._serve, name="tgix-masks", daemon=True)
            self._thread.start()

    @classmethod
    def inline(cls) -> MaskBuilder:
        return cls(None)

    def wait(self, grammar, state) -> bool:
        """Start building the state's mask (if needed) and wait for it at most `budget_s`.
        True: mask(state) is ready now. Inline (budget None, or no thread): built here."""
        t0 = time.perf_counter()
        try:
            if has_mask(grammar, state):
                return True
            if self._thread is None or self.budget_s is None:
                _build(grammar, state)
                return True
            done = self._submit(grammar, state, DEMANDED)
            if self.budget_s > 0:
                done.wait(self.budget_s)
            return has_mask(grammar, state)
        finally:
            self.waited_s.append(time.perf_counter() - t0)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put((STOP, 0, None, None, None))
            self._thread.join(timeout=5)
            self._thread = None

    def _submit(self, grammar, state, priority: int) -> threading.Event:
        key = (id(grammar), state)
        with self._lock:
            done = self._pending.get(key)
            if done is None:
                done = self._pending[key] = threading.Event()
                self._order += 1
                self._queue.put((priority, self._order, key, grammar, state))
            elif priority == DEMANDED:  # queued ahead: a row wants it now, put it first
                self._order += 1
                self._queue.put((priority, self._order, key, grammar, state))
        return done

    def _serve(self) -> None:
        from tgix.grammar.lazy_index import build_politely  # host code: numpy only

        build_politely()
        while (item := self._queue.get())[0] != STOP:
            priority, _, key, grammar, state = item
            wants_ahead = self.ahead and priority == DEMANDED
            ahead = _build(grammar, state, wants_ahead) if not has_mask(grammar, state) else []
            with self._lock:
                done = self._pending.pop(key, None)
            if done is None:  # a duplicate entry (re-queued as demanded): already built
                continue
            done.set()
            self._on_ready()  # a held row may have asked for it meanwhile
            for nxt in ahead if self._queue.qsize() < MAX_QUEUED_AHEAD else ():
                self._submit(grammar, nxt, AHEAD)


def _build(grammar, state, ahead: bool = False) -> list:
    """mask(state) and its forced token (what the fast-forward asks next); with `ahead`,
    returns the states worth building next (LazyTokenIndex.mask_and_successors; none for
    others). A failure stays with the grammar (its next call raises it), so nothing is lost
    here."""
    try:
        with_successors = getattr(grammar, "mask_and_successors", None) if ahead else None
        if with_successors is not None:
            ahead = with_successors(state)
        else:
            grammar.mask(state)
            ahead = []
        grammar.forced_token(state)
        return ahead
    except ValueError:  # GrammarError: the grammar remembers it for this state
        return []
    except Exception:  # remembered too (lazy_index.remember_failure); never kill the thread
        logger.exception("building a grammar mask failed")
        return []
