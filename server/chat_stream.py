"""The frames of a streamed chat completion (§2.6, §8.4).

A plain request streams one content chunk per token (text that may still turn into a stop
sequence is held back); a tool request streams tool-call chunks (server.tool_calls) and, when
the model picks `no_tool`, cancels that generation and streams a fresh tool-free one as plain
content. Usage follows the final token when asked for; errors found once streaming has begun
become an OpenAI error event; `data: [DONE]` always ends the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from server import openai_format
from server.chat import ChatRequest, render
from server.errors import ApiError
from server.generation import events, supersede
from server.openai_format import tool_delta
from server.sse import DONE, event
from server.state import ServerState
from server.tool_calls import CHOSE_NO_TOOL, ToolStream
from server.tools import Tool, next_call_id


async def _content(
    st: ServerState, chat: ChatRequest, prompt: str, shape: dict[str, Any]
) -> AsyncIterator[bytes]:
    hold = openai_format.StopHoldback(chat.params.stop)
    async with aclosing(events(st, prompt, chat.params, add_special_tokens=False)) as stream:
        async for ev, final in stream:
            piece = "" if ev is None or ev.token.special else ev.token.text
            text = hold.push(piece)
            logprob_ev = ev if chat.logprobs else None
            if final is None:
                yield event(openai_format.chat_chunk(text, ev=logprob_ev, **shape))
                continue
            text += hold.finish(final)
            reason = openai_format.finish_reason(final)
            yield event(openai_format.chat_chunk(text, ev=logprob_ev, reason=reason, **shape))
            if chat.include_usage:
                yield event(openai_format.usage_chunk(final, **shape))


async def _tool_call(
    st: ServerState, chat: ChatRequest, prompt: str, shape: dict[str, Any]
) -> AsyncIterator[bytes]:
    """Tool-call chunks; `no_tool` re-runs the request without tools as plain content."""
    tool, call_id, chose_no_tool = ToolStream(), next_call_id(chat.call_ids), False
    async with aclosing(events(st, prompt, chat.params, add_special_tokens=False)) as stream:
        async for ev, final in stream:
            token = None if ev is None else ev.token
            deltas = tool.push("" if token is None else token.text, bool(token and token.special))
            if deltas == CHOSE_NO_TOOL:
                chose_no_tool = True
                await supersede(stream)
                break
            reason = None if final is None else openai_format.finish_reason(final)
            logprob_ev = ev if chat.logprobs else None
            for name, arguments in deltas:
                delta = "" if arguments is None else tool_delta(call_id, name, arguments)
                yield event(openai_format.chat_chunk(delta, ev=logprob_ev, reason=reason, **shape))
            if final is not None and chat.include_usage:
                yield event(openai_format.usage_chunk(final, **shape))
    if chose_no_tool:
        plain = chat.without_tools()
        st.metrics.count.inc()  # a second generation, as TGI counts it
        prompt = await st.validator.run(render, plain, None)
        async for frame in _content(st, plain, prompt, shape):
            yield frame


async def chat_frames(
    st: ServerState,
    chat: ChatRequest,
    prompt: str,
    offered: list[Tool] | None,
    shape: dict[str, Any],
) -> AsyncIterator[bytes]:
    """Every frame of one streamed chat completion, `data: [DONE]` last."""
    frames = _content if offered is None else _tool_call
    try:
        async for frame in frames(st, chat, prompt, shape):
            yield frame
    except ApiError as exc:
        yield event(exc.openai_body())
    yield DONE
