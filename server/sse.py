"""Server-sent events exactly as TGI's axum 0.7 writes them, and the ASGI response that
carries them.

Each event is `data: <compact JSON>\\n\\n` (one space after the colon); an idle stream gets a
`:\\n\\n` comment every 15 s, which also makes a vanished client visible while a request
waits in the queue. `EventStream` ends early when the client disconnects or the drain
deadline passes, cancelling the frame generator (whose `finally` cancels the engine request)
and then calling `on_close` exactly once, even if the response never started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from server.engine_io import wait_for_disconnect
from server.jsonio import dumps

log = logging.getLogger("tgix.server")

KEEP_ALIVE = b":\n\n"
DONE = b"data: [DONE]\n\n"
KEEP_ALIVE_S = 15.0


def event(payload: Any) -> bytes:
    """One SSE data event with a JSON payload."""
    return b"data: " + dumps(payload) + b"\n\n"


class EventStream:
    """An ASGI response streaming `frames` (ready-made SSE bytes) with status 200."""

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        headers: dict[str, str],
        keep_alive_s: float = KEEP_ALIVE_S,
        abort: asyncio.Event | None = None,
        on_abort: bytes | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self.frames = frames
        self.headers = {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            **headers,
        }
        self.keep_alive_s = keep_alive_s
        self.abort = abort
        self.on_abort = on_abort  # the final frame(s) sent when the drain deadline hits
        self.on_close = on_close

    async def _pump(self, send) -> None:
        it = self.frames.__aiter__()
        while True:
            nxt = asyncio.ensure_future(anext(it))
            try:
                while True:
                    done, _ = await asyncio.wait({nxt}, timeout=self.keep_alive_s)
                    if done:
                        break
                    await _body(send, KEEP_ALIVE)
                frame = nxt.result()
            except StopAsyncIteration:
                return
            finally:
                if not nxt.done():
                    nxt.cancel()
                    await asyncio.gather(nxt, return_exceptions=True)
                elif not nxt.cancelled():
                    nxt.exception()  # ended as the pump was cancelled (client gone): retrieved
            await _body(send, frame)

    async def __call__(self, scope, receive, send) -> None:
        tasks: list[asyncio.Future] = []
        try:
            headers = [(k.encode(), v.encode()) for k, v in self.headers.items()]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            pump = asyncio.ensure_future(self._pump(send))
            gone = asyncio.ensure_future(wait_for_disconnect(receive))
            tasks = [pump, gone]
            if self.abort is not None:
                tasks.append(asyncio.ensure_future(self.abort.wait()))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if gone in done:
                return
            if pump in done and pump.exception() is not None:
                log.error("stream failed", exc_info=pump.exception())
            elif pump not in done and self.on_abort:
                await _body(send, self.on_abort)
            await _body(send, b"", more=False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.frames.aclose()  # type: ignore[attr-defined]  # an async generator
            if self.on_close is not None:
                self.on_close()


async def _body(send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})
