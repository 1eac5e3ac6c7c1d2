"""HTTP/1.1 connection guards under uvicorn: what a hostile or broken client cannot do.

- **Slow request heads** (slowloris): a request head must arrive whole within
  HEAD_TIMEOUT_S of the connection opening (or of the previous response ending). uvicorn
  re-arms its keep-alive timer on every byte, so a client trickling a byte every few seconds
  held a connection forever; this deadline does not move. Past it the connection gets a 408
  and is closed.
- **Open connections** are capped (`connection_cap`: below the process's file limit, with a
  log line saying so); uvicorn answers 503 beyond it.

Request smuggling (both `Content-Length` and `Transfer-Encoding`) is refused in front of
every route (server.middleware). Slow bodies are bounded where they are read
(server.jsonio.read_body), oversized streamed ones drained up to a bound so the 413 reaches
a client that sends everything before reading.
"""

from __future__ import annotations

import logging
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("tgix.server")

HEAD_TIMEOUT_S = 10.0
FD_RESERVE = 64  # files kept for the process itself (model files, caches, logs, workers)


def connection_cap(wanted: int) -> int:
    """At most `wanted` open connections, and fewer than the soft file limit allows."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(1, min(wanted, soft - FD_RESERVE))
    if cap < wanted:
        log.warning(
            "open connections capped at %d (file limit %d); raise `ulimit -n` for more",
            cap,
            soft,
        )
    return cap


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a fixed deadline for request heads."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline = None
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole head arrived
            self._cancel_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a head: tell the client why
            response = h11.Response(
                status_code=408, headers=[(b"connection", b"close"), (b"content-length", b"0")]
            )
            self.transport.write(self.conn.send(response) + self.conn.send(h11.EndOfMessage()))
        self.transport.close()
