"""Who gets in, and who is still in: the concurrency permits and the drain state.

`Permits` is TGI's `--max-concurrent-requests` semaphore: a non-blocking try-acquire taken
before validation and held until the response (or stream) ends, so it caps queued plus
running requests together and overload is refused at once with 429. `Drain` is the SIGTERM
state: new requests get 503 while in-flight ones finish, and at the deadline the rest are
told to end with an error event. Both live on the event loop thread; no locks needed.
"""

from __future__ import annotations

import asyncio
import weakref


class Permit:
    """`n` permits held by one request; `release()` is idempotent."""

    __slots__ = ("_n", "_owner")

    def __init__(self, owner: Permits, n: int):
        self._owner: Permits | None = owner
        self._n = n

    def release(self) -> None:
        if self._owner is not None:
            self._owner.available += self._n
            self._owner = None


class Permits:
    def __init__(self, total: int):
        self.total = total
        self.available = total

    @property
    def in_use(self) -> int:
        return self.total - self.available

    def try_acquire(self, n: int = 1) -> Permit | None:
        """All `n` permits at once, or None (the caller answers 429)."""
        if n > self.available:
            return None
        self.available -= n
        return Permit(self, n)


class Drain:
    """SIGTERM state shared by the middleware, the handlers and lifecycle.serve()."""

    def __init__(self) -> None:
        self.draining = False
        self.aborted = False
        self._events: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def abort_event(self) -> asyncio.Event:
        """Set when the graceful-termination deadline passes; streams then end. One event
        per event loop (the server has one; in-process test clients may use several)."""
        loop = asyncio.get_running_loop()
        event = self._events.get(loop)
        if event is None:
            event = self._events[loop] = asyncio.Event()
            if self.aborted:
                event.set()
        return event

    def start(self) -> None:
        self.draining = True

    def abort_all(self) -> None:
        """Called on the server's loop at the deadline."""
        self.draining = True
        self.aborted = True
        for event in list(self._events.values()):
            event.set()
