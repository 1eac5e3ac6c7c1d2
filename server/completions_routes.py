"""POST /v1/completions: one or several prompts (up to --max-client-batch-size), each an
independent generation with special tokens added; streamed events of the prompts interleave
and end with `data: [DONE]` (§2.7). A request takes one permit per prompt, all at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from server import errors, openai_format
from server.chat import sampling_params
from server.engine_io import ClientGone
from server.errors import ApiError, PlainError
from server.fields import Fields, check, deserialize_error
from server.generate_routes import json_response
from server.generation import acquire, events, run_once, sse, timing_headers
from server.jsonio import read_json
from server.schemas import GenerateParams
from server.sse import DONE, event
from server.state import ServerState, of

_END = object()


@dataclass(slots=True)
class CompletionRequest:
    prompts: list[str]
    params: GenerateParams
    stream: bool


def parse_completion(value, max_batch: int) -> CompletionRequest:
    f = Fields(value, "CompletionRequest")
    prompt = f.required("prompt", "any")
    if isinstance(prompt, str):
        prompts = [prompt]
    else:
        prompts = check(prompt, "list[str]", "prompt")
        if not prompts:
            raise deserialize_error(
                "prompt", "Empty array detected. Do not use an empty array for the prompt."
            )
    if f.value.get("suffix") is not None:
        raise ApiError(
            422,
            "Suffix is not supported and can be achieved by preprocessing the prompt.",
            "suffix not supported",
        )
    if len(prompts) > max_batch:
        raise ApiError(
            422,
            f"Number of prompts exceeds the maximum allowed batch size of {max_batch}",
            "batch size exceeded",
        )
    params = sampling_params(f, max_tokens=f.optional("max_tokens", "u32"))
    return CompletionRequest(prompts=prompts, params=params, stream=f.flag("stream"))


async def _prompt_frames(
    st: ServerState,
    index: int,
    prompt: str,
    req: CompletionRequest,
    shape: dict,
    out: asyncio.Queue,
) -> None:
    hold = openai_format.StopHoldback(req.params.stop)
    async with aclosing(events(st, prompt, req.params)) as stream:
        async for ev, final in stream:
            text = hold.push("" if ev is None or ev.token.special else ev.token.text)
            if final is not None:
                text += hold.finish(final)
            await out.put(event(openai_format.completion_chunk(index, text, final=final, **shape)))


async def _frames(st: ServerState, req: CompletionRequest, shape: dict) -> AsyncIterator[bytes]:
    queue: asyncio.Queue = asyncio.Queue()

    async def run(index: int, prompt: str) -> None:
        try:
            await _prompt_frames(st, index, prompt, req, shape, queue)
        except ApiError as exc:
            await queue.put(exc)
        finally:
            await queue.put(_END)

    tasks = [asyncio.ensure_future(run(i, p)) for i, p in enumerate(req.prompts)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, ApiError):
                yield event(item.openai_body())
                break
            else:
                yield item
        yield DONE
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_all(request: Request, st: ServerState, req: CompletionRequest):
    """All prompts concurrently; the first failure cancels the others."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(run_once(request.receive, st, p, req.params)) for p in req.prompts
            ]
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    return [task.result() for task in tasks]


async def completions_value(request: Request, st: ServerState, value) -> Response:
    try:
        req = parse_completion(value, st.settings.max_client_batch_size)
    except (PlainError, ApiError) as exc:
        return exc.response()
    st.metrics.count.inc(1 + len(req.prompts))  # TGI: the handler, then each prompt
    shape = {"model": st.model_id, "created": int(time.time()), "fingerprint": st.fingerprint}
    chars = sum(len(p) for p in req.prompts)
    try:
        permit = acquire(st, len(req.prompts))
    except ApiError as exc:
        return exc.response()
    if req.stream:
        abort = event(errors.shutting_down().openai_body()) + DONE
        return sse(st, _frames(st, req, shape), chars=chars, permit=permit, abort_frame=abort)
    try:
        outcomes = await _run_all(request, st, req)
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)
    finally:
        permit.release()
    body = openai_format.text_completion([o.completion for o in outcomes], **shape)
    return json_response(body, timing_headers(st, chars, outcomes))


async def completions(request: Request) -> Response:
    st = of(request)
    try:
        value = await read_json(request, st.settings.payload_limit)
    except PlainError as exc:
        return exc.response()
    return await completions_value(request, st, value)
