"""A request's event stream: the engine thread writes, an asyncio task or a plain thread reads.

The engine delivers each step's events for a request in one batch (`put_many`), so the last
TokenEvent and the Completion always arrive together: the server can attach the final text to
the last token without waiting. Exactly one terminal item ends every stream: a Completion, or
a GenerationError raised from the iterator.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from tgix.engine.request import Completion, GenerationError, TokenEvent

Item = TokenEvent | Completion | GenerationError


class RequestStream:
    """Iterate with `async for` (in the event loop that called submit) or plain `for`."""

    def __init__(self, request_id: str, cancel: Callable[[str], None]):
        self.request_id = request_id
        self._cancel = cancel
        self._sync: queue.SimpleQueue[Sequence[Item]] = queue.SimpleQueue()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            self._async: asyncio.Queue[Sequence[Item]] | None = asyncio.Queue()
        except RuntimeError:
            self._loop = self._async = None
        self._pending: list[Item] = []
        self.finished = False  # a terminal item was consumed

    # -- engine side (any thread) ---------------------------------------------------------------

    def put_many(self, items: Sequence[Item]) -> bool:
        """Deliver items; False when the reader's event loop is gone (treat as a disconnect)."""
        if self._loop is None:
            self._sync.put(items)
            return True
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, items)
        except RuntimeError:  # loop closed
            return False
        return True

    # -- reader side ----------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop generating for this request; its pages are freed within two steps."""
        if not self.finished:
            self._cancel(self.request_id)

    def _next_item(self, batch: Sequence[Item]) -> Item:
        self._pending.extend(batch)
        return self._pending.pop(0)

    def _deliver(self, item: Item) -> Item:
        if isinstance(item, GenerationError):
            self.finished = True
            raise item
        if isinstance(item, Completion):
            self.finished = True
        return item

    def __iter__(self) -> Iterator[TokenEvent | Completion]:
        if self._loop is not None:
            raise RuntimeError("submitted from an event loop: use `async for`")
        while not self.finished:
            item = self._pending.pop(0) if self._pending else self._next_item(self._sync.get())
            yield self._deliver(item)

    async def __aiter__(self) -> AsyncIterator[TokenEvent | Completion]:
        if self._async is None:
            raise RuntimeError("submitted outside an event loop: use `for`")
        while not self.finished:
            if self._pending:
                item = self._pending.pop(0)
            else:
                item = self._next_item(await self._async.get())
            yield self._deliver(item)
