"""Several generations for one response (prompts x `n` choices), run concurrently.

`run_all` awaits every one (the first failure cancels the others and is raised); `merged`
interleaves per-choice streams of frames in the order they are produced, and ends every
stream at the first ApiError, which it re-raises after the frames already produced;
`response_frames` is a whole OpenAI stream over the choices' frames (each choice yields its
SSE frames, then its Completion): the usage chunk when asked for, an error event at the first
failure, `data: [DONE]` last. Every path cancels what is still running, so an abandoned
response never leaves work behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import aclosing
from typing import TypeVar

from server import openai_format
from server.errors import ApiError
from server.openai_format import Shape
from server.sse import DONE, event
from tgix.engine.request import Completion

T = TypeVar("T")
_END = object()


async def run_all(coros: Sequence[Awaitable[T]]) -> list[T]:
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    return [task.result() for task in tasks]


async def merged(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream) as items:
                async for item in items:
                    await queue.put(item)
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put(exc)
        finally:
            await queue.put(_END)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def response_frames(
    choices: Sequence[AsyncIterator[bytes | Completion]], shape: Shape, usage_object: str | None
) -> AsyncIterator[bytes]:
    """The SSE frames of every choice as they come; then, with `usage_object` (the chunk's
    `object`, when `stream_options.include_usage`), one chunk with every choice's usage."""
    finals: list[Completion] = []
    try:
        async for frame in merged(choices):
            if isinstance(frame, Completion):
                finals.append(frame)
            else:
                yield frame
        if usage_object is not None:
            yield event(openai_format.usage_chunk(finals, shape, usage_object))
    except ApiError as exc:
        yield event(exc.openai_body())
    yield DONE
