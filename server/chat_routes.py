"""POST /v1/chat/completions (stream and not) and POST /chat_tokenize.

Request-shape problems found before generation (body, template, tools) are normal HTTP
422s; overload is a 429 before any SSE byte; problems found by validation or generation
arrive inside the 200 stream as `{"error": {"message", "http_status_code": 422}}` followed
by `data: [DONE]` (§2.6). `model` is echoed unless absent or "tgi".
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request
from starlette.responses import Response

from server import errors, openai_format
from server.chat import ChatRequest, apply_tools, parse_chat, render
from server.engine_io import ClientGone
from server.errors import ApiError, PlainError
from server.generate_routes import json_response
from server.generation import acquire, events, run_once, sse, timing_headers
from server.jsonio import read_json
from server.sse import DONE, event
from server.state import ServerState, of
from server.tokenize import simple_tokens


async def _prompt(st: ServerState, chat: ChatRequest) -> str:
    tools = apply_tools(chat)
    return await st.validator.run(render, chat.messages, tools)


async def _chat_frames(
    st: ServerState, chat: ChatRequest, prompt: str, model: str, created: int
) -> AsyncIterator[bytes]:
    shape = {"model": model, "created": created, "fingerprint": st.fingerprint}
    hold = openai_format.StopHoldback(chat.params.stop)
    try:
        async with aclosing(events(st, prompt, chat.params, add_special_tokens=False)) as stream:
            async for ev, final in stream:
                piece = "" if ev is None or ev.token.special else ev.token.text
                text = hold.push(piece)
                if final is None:
                    logprob_ev = ev if chat.logprobs else None
                    yield event(openai_format.chat_chunk(text, ev=logprob_ev, **shape))
                    continue
                text += hold.finish(final)
                reason = openai_format.finish_reason(final)
                logprob_ev = ev if chat.logprobs else None
                yield event(openai_format.chat_chunk(text, ev=logprob_ev, reason=reason, **shape))
                if chat.include_usage:
                    yield event(openai_format.usage_chunk(final, **shape))
    except ApiError as exc:
        yield event(exc.openai_body())
    yield DONE


def _openai_abort_frame() -> bytes:
    return event(errors.shutting_down().openai_body()) + DONE


async def chat_value(request: Request, st: ServerState, value) -> Response:
    try:
        chat = parse_chat(value)
    except PlainError as exc:
        return exc.response()
    st.metrics.count.inc()  # TGI counts a chat request here and again for its generation
    try:
        prompt = await _prompt(st, chat)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        return exc.response()
    model = st.model_id if chat.model in (None, "tgi") else chat.model
    created = int(time.time())
    st.metrics.count.inc()
    try:
        permit = acquire(st)
    except ApiError as exc:
        return exc.response()
    if chat.stream:
        frames = _chat_frames(st, chat, prompt, model, created)
        return sse(st, frames, chars=len(prompt), permit=permit, abort_frame=_openai_abort_frame())
    try:
        outcome = await run_once(request.receive, st, prompt, chat.params, add_special_tokens=False)
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)
    finally:
        permit.release()
    body = openai_format.chat_completion(
        outcome.completion,
        model=model,
        created=created,
        fingerprint=st.fingerprint,
        with_logprobs=chat.logprobs,
    )
    return json_response(body, timing_headers(st, len(prompt), [outcome]))


async def chat_completions(request: Request) -> Response:
    st = of(request)
    try:
        value = await read_json(request, st.settings.payload_limit)
    except PlainError as exc:
        return exc.response()
    return await chat_value(request, st, value)


async def chat_tokenize(request: Request) -> Response:
    """The templated prompt and its tokens (no special tokens added: the template has them)."""
    st = of(request)
    try:
        chat = parse_chat(await read_json(request, st.settings.payload_limit))
    except PlainError as exc:
        return exc.response()
    st.metrics.count.inc()
    try:
        prompt = await _prompt(st, chat)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        return exc.response()
    tokens = await st.validator.run(simple_tokens, prompt, False)
    return json_response({"tokenize_response": tokens, "templated_text": prompt})
