"""Stop sequences matched as text streams in, in time and memory linear in their length.

Each stop keeps the length of its longest prefix that ends the text so far, advanced one
character at a time with its Knuth-Morris-Pratt failure table (one int per character of the
stop). So a stop of n characters costs O(n) to set up and O(1) amortised per character
streamed, whatever its length (a set of every prefix, the obvious structure, is O(n^2): 1.3 GB
for one 60,000-character stop). `partial` is how much of the text's end may still grow into a
stop: what a stream must hold back. Host only (no jax).
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterable


@functools.lru_cache(maxsize=256)
def failure_table(stop: str) -> array:
    """fail[i]: the length of the longest proper prefix of stop[: i + 1] that is also its
    suffix (the classic KMP table). Cached: the server builds a request's tables in its
    validation pool, so the engine thread only looks them up (read-only)."""
    fail = array("i", bytes(4 * len(stop)))
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        if stop[i] == stop[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    """feed(text) -> (stop, offset in `text` right after its last character) for the first
    stop completed in `text` (the longer one when several end at the same character), or
    None. After a match the matcher is done: `matched` says which stop. Empty stops are
    ignored, repeated ones kept once."""

    def __init__(self, stops: Iterable[str]):
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._fail = [failure_table(s) for s in self.stops]
        self._state = [0] * len(self.stops)
        self.matched: str | None = None

    @property
    def partial(self) -> int:
        """Characters at the end of the text fed so far that begin some stop (hold them)."""
        return max(self._state, default=0)

    def peek(self, text: str) -> int | None:
        """Where in `text` feeding it would complete a stop (the offset after its last
        character), or None; the matcher is left as it was (a draft's look ahead)."""
        if self.matched is not None or not self.stops:
            return None
        saved = list(self._state)
        try:
            match = self.feed(text)
        finally:
            self._state, self.matched = saved, None
        return None if match is None else match[1]

    def feed(self, text: str) -> tuple[str, int] | None:
        if self.matched is not None:
            raise RuntimeError(f"stop sequence {self.matched!r} already matched")
        if not self.stops:
            return None
        for offset, ch in enumerate(text, start=1):
            best: str | None = None
            for i, stop in enumerate(self.stops):
                k, fail = self._state[i], self._fail[i]
                while k and stop[k] != ch:
                    k = fail[k - 1]
                if stop[k] == ch:
                    k += 1
                if k == len(stop):
                    best = stop if best is None or len(stop) > len(best) else best
                    k = fail[k - 1]
                self._state[i] = k
            if best is not None:
                self.matched = best
                return best, offset
        return None
