"""The route-independent core of a generation: permit, validation, engine, metrics.

TGI and OpenAI routes differ only in how they parse the request and shape the output; all
of them call `acquire()` for concurrency permits (429 at once), then `run_once()` (one
Completion, racing the client's disconnect) or `events()` (token events for a stream), and
hand stream frames to `sse()`. Every exit path cancels an unfinished engine request and
records TGI's request metrics exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from server import errors
from server.admission import Permit
from server.engine_io import ClientGone, collect, paired
from server.errors import ApiError
from server.schemas import GenerateParams
from server.sse import EventStream
from server.state import Clock, ServerState
from tgix.engine.request import Completion, GenerationError, GenerationRequest, TokenEvent


@dataclass(frozen=True, slots=True)
class Outcome:
    completion: Completion
    request: GenerationRequest
    clock: Clock


class Superseded(Exception):
    """Thrown into `events()` (with `supersede()`) by a caller that replaces its generation,
    as a tool stream that chose `no_tool` does: the engine request is cancelled and, unlike a
    vanished client, no failure is counted."""


async def supersede(gen: AsyncGenerator) -> None:
    """End an `events()` generator early on purpose (see Superseded)."""
    with contextlib.suppress(StopAsyncIteration, Superseded):
        await gen.athrow(Superseded())


def acquire(st: ServerState, n: int = 1) -> Permit:
    """`n` permits or the 429 ApiError (counted as `overloaded`)."""
    permit = st.permits.try_acquire(n)
    if permit is None:
        st.metrics.failed("overloaded")
        raise errors.overloaded()
    return permit


def acquire_for(st: ServerState, p: GenerateParams) -> Permit:
    """/generate's order: the best_of bound check, then one permit per best_of sequence."""
    try:
        n = st.validator.best_of(p)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        raise
    return acquire(st, n)


def _submit(st: ServerState, request: GenerationRequest):
    try:
        return st.engine.submit(request)
    except GenerationError as exc:
        raise errors.from_generation_error(exc) from None


def _succeeded(st: ServerState, c: Completion, request: GenerationRequest, clock: Clock) -> None:
    st.metrics.succeeded(
        c,
        total_s=clock.total_s(),
        validation_s=clock.validation_s,
        max_new_tokens=request.max_new_tokens,
    )


async def run_once(
    receive, st: ServerState, inputs: str, p: GenerateParams, *, add_special_tokens: bool = True
) -> Outcome:
    """Validate, generate to the Completion, record metrics. Raises ApiError or ClientGone;
    the caller holds the permit."""
    clock = Clock()
    try:
        request = await st.validator.validate(inputs, p, add_special_tokens=add_special_tokens)
        clock.mark_validated()
        completion = await collect(_submit(st, request), receive, st.drain.abort_event)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        raise
    except ClientGone:
        st.metrics.failed("dropped")
        raise
    _succeeded(st, completion, request, clock)
    return Outcome(completion, request, clock)


async def events(
    st: ServerState, inputs: str, p: GenerateParams, *, add_special_tokens: bool = True
) -> AsyncIterator[tuple[TokenEvent | None, Completion | None]]:
    """Validate, submit and yield `paired()`'s (event, final Completion or None). Raises
    ApiError (counted). Use with `contextlib.aclosing` so an abandoned stream cancels its
    engine request."""
    clock = Clock()
    stream, finished = None, False
    try:
        request = await st.validator.validate(inputs, p, add_special_tokens=add_special_tokens)
        clock.mark_validated()
        stream = _submit(st, request)
        async for ev, final in paired(stream):
            if final is not None:
                finished = True
                _succeeded(st, final, request, clock)
            yield ev, final
    except ApiError as exc:
        finished = True
        st.metrics.failed(exc.metric_label)
        raise
    except Superseded:
        finished = True
        if stream is not None:
            stream.cancel()
    finally:
        if stream is not None and not finished:
            stream.cancel()
            st.metrics.failed("dropped")


def sse(
    st: ServerState,
    frames: AsyncIterator[bytes],
    *,
    chars: int,
    permit: Permit | None,
    abort_frame: bytes,
) -> EventStream:
    """An SSE response over `frames`; the permit is returned when the stream ends."""
    return EventStream(
        frames,
        headers=st.stream_headers(chars),
        keep_alive_s=st.keep_alive_s,
        abort=st.drain.abort_event,
        on_abort=abort_frame,
        on_close=None if permit is None else permit.release,
    )


def timing_headers(st: ServerState, chars: int, outcomes: list[Outcome]) -> dict[str, str]:
    """TGI's x-* headers of a non-streaming response (summed over several prompts)."""

    def ms(seconds: float) -> str:
        return str(int(seconds * 1000))

    total = max(o.clock.total_s() for o in outcomes)
    completions = [o.completion for o in outcomes]
    generated = sum(c.generated_tokens for c in completions)
    inference = sum(c.inference_time for c in completions)
    return {
        "x-compute-type": st.compute_type,
        "x-compute-time": repr(total),
        "x-compute-characters": str(chars),
        "x-total-time": ms(total),
        "x-validation-time": ms(max(o.clock.validation_s for o in outcomes)),
        "x-queue-time": ms(sum(c.queue_time for c in completions)),
        "x-inference-time": ms(inference),
        "x-time-per-token": ms(inference / generated if generated else 0.0),
        "x-prompt-tokens": str(sum(c.input_length for c in completions)),
        "x-generated-tokens": str(generated),
    }
