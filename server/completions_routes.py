"""POST /v1/completions: prompts (text or token ids, up to --max-client-batch-size) x `n`
choices, each an independent generation (special tokens added to text prompts; token ids are
taken as given). Streamed choices interleave, each event naming its `index`, and end with
`data: [DONE]` (§2.7). A request takes one permit per choice, all at once. Parsing and the
range checks are in server.completions_request, the JSON shapes in server.completions_format.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request
from starlette.responses import Response

from server import errors, openai_format
from server.choices import response_frames, run_all
from server.completions_format import (
    TokenLogprobs,
    choice_logprobs,
    choice_text,
    completion_chunk,
    text_completion,
)
from server.completions_request import CompletionRequest, Prompt, parse_completion
from server.engine_io import ClientGone
from server.errors import ApiError, PlainError
from server.generate_routes import json_response
from server.generation import acquire, events, run_once, sse, timing_headers
from server.jsonio import read_json
from server.openai_format import Shape, new_id
from server.sse import DONE, event
from server.state import ServerState, of
from tgix.engine.request import Completion


def _decode(tokenizer, ids: tuple[int, ...]) -> str:
    return tokenizer.decode(list(ids))


async def _prompt_texts(st: ServerState, req: CompletionRequest) -> list[str | None]:
    """Each prompt's text for `echo` (token ids decoded in the validation pool), else None."""
    if not req.echo:
        return [None] * len(req.prompts)
    return [p if isinstance(p, str) else await st.validator.run(_decode, p) for p in req.prompts]


async def _choice_frames(
    st: ServerState,
    req: CompletionRequest,
    prompt: Prompt,
    prompt_text: str | None,
    index: int,
    shape: Shape,
) -> AsyncIterator[bytes | Completion]:
    """One choice's events (the echoed prompt first), then its Completion."""
    if prompt_text is not None:
        yield event(completion_chunk(index, prompt_text, shape))
    hold = openai_format.StopHoldback(req.params.stop)
    offset = len(prompt_text or "")
    params = req.params.for_choice(index % req.n)
    async with aclosing(events(st, prompt, params)) as stream:
        async for ev, final in stream:
            text = hold.push("" if ev is None or ev.token.special else ev.token.text)
            logprobs = None
            if req.logprobs is not None and ev is not None and not req.score_only:
                lists = TokenLogprobs(offset)
                lists.add(ev.token, ev.top_tokens)
                offset, logprobs = lists.offset, lists.body()
            reason = None
            if final is not None:
                text += hold.finish(final)
                reason = "length" if req.score_only else openai_format.finish_reason(final)
            if req.score_only:
                text = ""
            yield event(completion_chunk(index, text, shape, logprobs=logprobs, reason=reason))
            if final is not None:
                yield final


def _frames(
    st: ServerState, req: CompletionRequest, texts: list[str | None], shape: Shape
) -> AsyncIterator[bytes]:
    choices = [
        _choice_frames(st, req, prompt, texts[i], i * req.n + j, shape)
        for i, prompt in enumerate(req.prompts)
        for j in range(req.n)
    ]
    return response_frames(choices, shape, "text_completion" if req.include_usage else None)


async def _answers(request: Request, st: ServerState, req: CompletionRequest):
    runs = [
        run_once(request.receive, st, prompt, req.params.for_choice(j))
        for prompt in req.prompts
        for j in range(req.n)
    ]
    return await run_all(runs)


def _body(req: CompletionRequest, outcomes, texts: list[str | None], shape: Shape) -> dict:
    choices = []
    for index, outcome in enumerate(outcomes):
        c = outcome.completion
        text = choice_text(c, texts[index // req.n], req.score_only)
        logprobs = None
        if req.logprobs is not None:
            logprobs = choice_logprobs(c, echo=req.echo, score_only=req.score_only)
        choices.append((c, text, logprobs))
    return text_completion(choices, shape, score_only=req.score_only)


async def completions_value(request: Request, st: ServerState, value) -> Response:
    try:
        req = parse_completion(value, st.settings)
    except (PlainError, ApiError) as exc:
        return exc.response()
    choices = len(req.prompts) * req.n
    st.metrics.count.inc(1 + choices)  # TGI: the handler, then each generation
    shape = Shape(new_id("cmpl"), st.model_id, int(time.time()), st.fingerprint)
    chars = sum(len(p) for p in req.prompts)
    try:
        permit = acquire(st, choices)
    except ApiError as exc:
        return exc.response()
    try:
        texts = await _prompt_texts(st, req)
    except BaseException:
        permit.release()
        raise
    if req.stream:
        abort = event(errors.shutting_down().openai_body()) + DONE
        frames = _frames(st, req, texts, shape)
        return sse(st, frames, chars=chars, permit=permit, abort_frame=abort)
    try:
        outcomes = await _answers(request, st, req)
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)
    finally:
        permit.release()
    return json_response(_body(req, outcomes, texts, shape), timing_headers(st, chars, outcomes))


async def completions(request: Request) -> Response:
    st = of(request)
    try:
        value = await read_json(request, st.settings.payload_limit)
    except PlainError as exc:
        return exc.response()
    return await completions_value(request, st, value)
