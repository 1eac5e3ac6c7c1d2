"""Reading an engine RequestStream from a handler, with the client and the drain watched.

`paired()` yields each TokenEvent together with the Completion when that token is the last
one, because TGI's final stream event *is* the last token carrying `generated_text` and
`details`. Contract with the engine: the final TokenEvent and the Completion are delivered in
the same event-loop callback, so once the last token has been read the Completion is already
queued; `paired()` peeks for it for a few loop turns (microseconds), so tokens are never
held back waiting for the next one.

`collect()` runs a non-streaming request to its Completion while racing the client's
disconnect and the drain deadline: Starlette does not cancel a plain handler when the client
leaves, so without this a queued or running request would keep its pages until max_tokens.
Whatever ends the wait, an unfinished engine request is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from server import errors
from tgix.engine.request import Completion, GenerationError, TokenEvent

log = logging.getLogger("tgix.server")

Receive = Callable[[], Awaitable[dict[str, Any]]]


# Loop turns paired() waits for an already-queued item (microseconds; never a token's time).
PEEK_TURNS = 3


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def paired(stream) -> AsyncIterator[tuple[TokenEvent | None, Completion | None]]:
    """(event, None) for each token, (last event, Completion) at the end. Raises ApiError for
    a GenerationError or a stream that ends without a Completion. (None, Completion) only if
    an engine breaks the delivery contract above; it is logged."""
    it = stream.__aiter__()
    held: TokenEvent | None = None
    nxt: asyncio.Future | None = None
    try:
        while True:
            if held is None:
                item = await anext(it)
            else:
                nxt = asyncio.ensure_future(anext(it))
                for _ in range(PEEK_TURNS):  # lets the peek finish if the item is queued
                    await asyncio.sleep(0)
                    if nxt.done():
                        break
                else:
                    yield held, None
                    held = None
                item = await nxt
                nxt = None
            if isinstance(item, Completion):
                if held is None:
                    log.warning("engine delivered a Completion apart from its last token")
                yield held, item
                return
            if held is not None:
                yield held, None
            held = item
    except StopAsyncIteration:
        if held is not None:
            yield held, None
        raise errors.incomplete(stream=True) from None
    except GenerationError as exc:
        if held is not None:
            yield held, None
        raise errors.from_generation_error(exc) from None
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()
            await asyncio.gather(nxt, return_exceptions=True)
        elif nxt is not None and not nxt.cancelled():
            nxt.exception()  # a peek that ended the stream while the consumer left: retrieved


async def _drain_completion(stream) -> Completion:
    try:
        async for item in stream:
            if isinstance(item, Completion):
                return item
    except GenerationError as exc:
        raise errors.from_generation_error(exc) from None
    raise errors.incomplete(stream=False)


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns once the client has gone (call only after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect(stream, receive: Receive, abort: asyncio.Event) -> Completion:
    """The request's Completion, or ClientGone / ApiError; cancels the engine request on
    any early exit."""
    work = asyncio.ensure_future(_drain_completion(stream))
    gone = asyncio.ensure_future(wait_for_disconnect(receive))
    aborted = asyncio.ensure_future(abort.wait())
    try:
        done, _ = await asyncio.wait({work, gone, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (gone, aborted):
            task.cancel()
        if not work.done():
            work.cancel()
            stream.cancel()
        await asyncio.gather(gone, aborted, return_exceptions=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(work, return_exceptions=True)
    if work in done:
        return work.result()
    if gone in done:
        gone.result()  # re-raises if watching the client itself failed
        raise ClientGone()
    aborted.result()
    raise errors.shutting_down()
