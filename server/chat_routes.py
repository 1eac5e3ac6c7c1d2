"""POST /v1/chat/completions (stream and not) and POST /chat_tokenize.

Request-shape problems found before generation (body, template, tools) are normal HTTP
422s; overload is a 429 before any SSE byte; problems found by validation or generation
(grammar compilation included) arrive inside the 200 stream as `{"error": {"message",
"http_status_code": 422}}` followed by `data: [DONE]` (§2.6). `model` is echoed unless absent
or "tgi". `n` choices run as `n` generations (they share the prompt's cached pages), each
with its own seed when the request is seeded. A tool request's answer comes back as
`tool_calls` (server.tool_calls); when the model picks `no_tool` the request runs again
without tools and the plain answer is returned.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from server import errors, openai_format
from server.chat import ChatRequest, apply_tools, parse_chat, render
from server.chat_stream import chat_frames
from server.choices import run_all
from server.engine_io import ClientGone
from server.errors import ApiError, PlainError
from server.generate_routes import json_response
from server.generation import Outcome, acquire, run_once, sse, timing_headers
from server.jsonio import read_json
from server.openai_format import Shape, new_id
from server.sse import DONE, event
from server.state import ServerState, of
from server.tokenize import simple_tokens
from server.tool_calls import parse_call
from server.tools import NO_TOOL_NAME, Tool, next_call_id


async def _prompt(st: ServerState, chat: ChatRequest) -> tuple[str, list[Tool] | None]:
    """The templated prompt and the tools offered (None: a plain answer)."""
    offered = apply_tools(chat)
    return await st.validator.run(render, chat, offered), offered


def _openai_abort_frame() -> bytes:
    return event(errors.shutting_down().openai_body()) + DONE


async def _answer(
    request: Request, st: ServerState, chat: ChatRequest, prompt: str, offered
) -> tuple[Outcome, str, list[dict] | None]:
    """One non-streamed choice: (outcome, its prompt, tool_calls or None). A tool answer
    that is not a call is a 422 tool_error; `no_tool` runs the request again without tools."""
    outcome = await run_once(request.receive, st, prompt, chat.params, add_special_tokens=False)
    if offered is None:
        return outcome, prompt, None
    name, arguments = parse_call(outcome.completion.generated_text)
    if name != NO_TOOL_NAME:
        call = openai_format.tool_call(next_call_id(chat.call_ids), name, arguments)
        return outcome, prompt, [call]
    plain = chat.without_tools()
    st.metrics.count.inc()  # a second generation, as TGI counts it
    prompt = await st.validator.run(render, plain, None)
    outcome = await run_once(request.receive, st, prompt, plain.params, add_special_tokens=False)
    return outcome, prompt, None


async def chat_value(request: Request, st: ServerState, value) -> Response:
    try:
        chat = parse_chat(value, st.settings.max_concurrent_requests)
    except (PlainError, ApiError) as exc:
        return exc.response()
    st.metrics.count.inc()  # TGI counts a chat request here and again for its generation
    try:
        prompt, offered = await _prompt(st, chat)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        return exc.response()
    model = st.model_id if chat.model in (None, "tgi") else chat.model
    shape = Shape(new_id("chatcmpl"), model, int(time.time()), st.fingerprint)
    st.metrics.count.inc()
    try:
        permit = acquire(st, chat.n)
    except ApiError as exc:
        return exc.response()
    if chat.stream:
        frames = chat_frames(st, chat, prompt, offered, shape)
        return sse(st, frames, chars=len(prompt), permit=permit, abort_frame=_openai_abort_frame())
    try:
        answers = [_answer(request, st, chat.for_choice(j), prompt, offered) for j in range(chat.n)]
        answers = await run_all(answers)
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)
    finally:
        permit.release()
    body = openai_format.chat_completion(
        [outcome.completion for outcome, _, _ in answers],
        shape,
        with_logprobs=chat.logprobs,
        tool_calls=[calls for _, _, calls in answers],
    )
    outcomes = [outcome for outcome, _, _ in answers]
    return json_response(body, timing_headers(st, len(answers[0][1]), outcomes))


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
        value = await read_json(request, st.settings.payload_limit)
        chat = parse_chat(value, st.settings.max_concurrent_requests)
    except (PlainError, ApiError) as exc:
        return exc.response()
    st.metrics.count.inc()
    try:
        prompt, _ = await _prompt(st, chat)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        return exc.response()
    try:
        permit = acquire(st)
    except ApiError as exc:
        return exc.response()
    try:
        tokens = await st.validator.run(simple_tokens, prompt, False)
    finally:
        permit.release()
    return json_response({"tokenize_response": tokens, "templated_text": prompt})
