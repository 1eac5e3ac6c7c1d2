"""TGI's own generation routes: POST /generate, /generate_stream, / (compat) and /tokenize.

Order of checks per request, as TGI's router does it (§3.2): body parsing (framework 4xx),
stream-only rules, the concurrency permit, then validation and the engine. One deliberate
difference: overload on a streaming route is a real HTTP 429 sent before any SSE byte (TGI
sends it as an event inside a 200); every other stream error is an event, as in TGI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request
from starlette.responses import Response

from server import errors, serialize
from server.engine_io import ClientGone
from server.errors import ApiError, PlainError
from server.generation import acquire, acquire_for, events, run_once, sse, timing_headers
from server.jsonio import dumps, read_json
from server.schemas import GenerateBody, GenerateParams, parse_generate
from server.sse import event
from server.state import ServerState, of
from server.tokenize import simple_tokens


def json_response(body, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), 200, headers=headers, media_type="application/json")


async def _one_frame(frame: bytes) -> AsyncIterator[bytes]:
    yield frame


async def _tgi_frames(
    st: ServerState, inputs: str, p: GenerateParams, prefix: str
) -> AsyncIterator[bytes]:
    index = 0
    try:
        async with aclosing(events(st, inputs, p)) as stream:
            async for ev, final in stream:
                ev = ev or serialize.last_event(final, index)
                if ev is None:
                    raise errors.incomplete(stream=True)
                index = ev.index
                body = serialize.stream_response(ev, final, with_details=p.details, prefix=prefix)
                yield event(body)
    except ApiError as exc:
        yield event(exc.body())


def stream_response(st: ServerState, inputs: str, p: GenerateParams, prefix: str) -> Response:
    st.metrics.count.inc()
    try:
        st.validator.stream_only(p)
    except ApiError as exc:
        st.metrics.failed(exc.metric_label)
        frames = _one_frame(event(exc.body()))
        return sse(st, frames, chars=len(inputs), permit=None, abort_frame=b"")
    try:
        permit = acquire(st)
    except ApiError as exc:
        return exc.response()
    return sse(
        st,
        _tgi_frames(st, inputs, p, prefix),
        chars=len(inputs),
        permit=permit,
        abort_frame=event(errors.shutting_down().body()),
    )


async def generate_response(request: Request, st: ServerState, body: GenerateBody, *, array: bool):
    """A non-streaming TGI generation: GenerateResponse (in a list for `/`)."""
    p = body.params
    prefix = body.inputs if p.return_full_text else ""
    st.metrics.count.inc()
    try:
        permit = acquire_for(st, p)
        try:
            outcome = await run_once(request.receive, st, body.inputs, p)
        finally:
            permit.release()
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)  # nobody is listening any more
    with_details = p.details or p.decoder_input_details
    result = serialize.generate_response(
        outcome.completion, with_details=with_details, prefix=prefix
    )
    headers = timing_headers(st, len(body.inputs), [outcome])
    return json_response([result] if array else result, headers)


async def _parse(request: Request, st: ServerState, *, compat: bool = False):
    return parse_generate(await read_json(request, st.settings.payload_limit), compat=compat)


async def generate(request: Request) -> Response:
    st = of(request)
    try:
        body = await _parse(request, st)
    except PlainError as exc:
        return exc.response()
    return await generate_response(request, st, body, array=False)


async def generate_stream(request: Request) -> Response:
    st = of(request)
    try:
        body = await _parse(request, st)
    except PlainError as exc:
        return exc.response()
    prefix = body.inputs if body.params.return_full_text else ""
    return stream_response(st, body.inputs, body.params, prefix)


async def compat_value(request: Request, st: ServerState, value) -> Response:
    """`/` and /invocations with `inputs`: `return_full_text` defaults from the model's
    pipeline tag; a JSON array when not streaming (§2.5)."""
    try:
        body = parse_generate(value, compat=True)
    except PlainError as exc:
        return exc.response()
    if body.params.return_full_text is None:
        body.params.return_full_text = st.full_text_default
    if body.stream:
        prefix = body.inputs if body.params.return_full_text else ""
        return stream_response(st, body.inputs, body.params, prefix)
    return await generate_response(request, st, body, array=True)


async def compat(request: Request) -> Response:
    st = of(request)
    try:
        value = await read_json(request, st.settings.payload_limit)
    except PlainError as exc:
        return exc.response()
    return await compat_value(request, st, value)


async def tokenize(request: Request) -> Response:
    """The prompt's tokens with byte offsets, special tokens added; `truncate` is ignored."""
    st = of(request)
    try:
        body = await _parse(request, st)
    except PlainError as exc:
        return exc.response()
    try:
        permit = acquire(st)  # a flood of tokenizations waits its turn like generations
    except ApiError as exc:
        return exc.response()
    try:
        tokens = await st.validator.run(simple_tokens, body.inputs, True)
    finally:
        permit.release()
    return json_response(tokens)
