"""Running the app under uvicorn with TGI-style graceful termination.

On SIGTERM (or SIGINT): /health turns 503 and new requests get TGI's 503 (with `Connection:
close`, so kept-alive clients reconnect elsewhere) while in-flight requests and streams
continue for up to --graceful-termination-timeout seconds; the listener closes once none is
left; at the deadline the rest end with an explicit error
(an SSE error event, or 503 for a waiting non-streaming call); then the engine is shut down
and the process exits normally. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import uvicorn

from server.protocol import GuardedH11Protocol, connection_cap
from server.settings import Settings

log = logging.getLogger("tgix.server")

# uvicorn's own wait is a backstop: streams are ended by the drain deadline first.
UVICORN_MARGIN_S = 5.0
DRAIN_POLL_S = 0.05
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's default)
MAX_CONNECTIONS = 4096  # open connections (and so file descriptors), capped by `ulimit -n`


class _Server(uvicorn.Server):
    """uvicorn without its signal handling: ours drains first, and uvicorn's would re-raise
    the signal after shutdown, killing the process with a non-zero status."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def make_server(app, settings: Settings) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host=settings.hostname,
        port=settings.port,
        lifespan="off",
        log_config=None,
        access_log=False,
        ws="none",
        timeout_graceful_shutdown=settings.graceful_termination_timeout + UVICORN_MARGIN_S,
        http=GuardedH11Protocol,  # request heads within a fixed deadline
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=connection_cap(MAX_CONNECTIONS),
    )
    return _Server(config)


def begin_drain(app, server: uvicorn.Server, timeout_s: float) -> None:
    """Start a graceful termination now (what SIGTERM does); idempotent-ish: a second call
    ends the remaining requests at once. The listener stays open while requests are in
    flight, so new requests get TGI's 503 (with `Connection: close`) rather than a refused
    connection; it closes once none is left, or at the deadline."""
    drain = app.state.tgix.drain
    loop = asyncio.get_running_loop()
    if drain.draining:
        log.info("second signal: ending the remaining requests now")
        drain.abort_all()
        server.should_exit = True
        return
    log.info("draining: waiting up to %ss for in-flight requests", timeout_s)
    drain.start()
    loop.call_later(timeout_s, drain.abort_all)
    loop.create_task(_close_when_idle(app, server, loop.time() + timeout_s))


async def _close_when_idle(app, server: uvicorn.Server, deadline: float) -> None:
    """Close the listener once no request holds a permit (or at the deadline, when the
    rest have been told to end)."""
    permits, loop = app.state.tgix.permits, asyncio.get_running_loop()
    while permits.in_use and loop.time() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    server.should_exit = True


async def serve_async(app, settings: Settings, *, sockets: list[socket.socket] | None = None):
    """Serve until SIGTERM/SIGINT, drain, then shut the engine down."""
    state = app.state.tgix
    server = make_server(app, settings)
    loop = asyncio.get_running_loop()
    timeout = float(settings.graceful_termination_timeout)
    handled = (signal.SIGTERM, signal.SIGINT)
    for sig in handled:
        loop.add_signal_handler(sig, begin_drain, app, server, timeout)
    try:
        await server.serve(sockets=sockets)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        state.validator.close()
        await loop.run_in_executor(None, state.engine.shutdown)
        log.info("engine shut down")


def serve(app, settings: Settings) -> None:
    asyncio.run(serve_async(app, settings))
