"""The frames of a streamed chat completion (§2.6, §8.4), for `n` choices at once.

A plain choice streams one content chunk per token (text that may still turn into a stop
sequence is held back); a tool choice streams tool-call chunks (server.tool_calls: every
argument character, canonical, in order) and ends with one chunk carrying `finish_reason`
"tool_calls"; a call cut short (by `max_tokens`) ends the stream with the non-streamed
route's 422 tool_error as an error event. When the model picks `no_tool` that choice cancels
its generation and streams a fresh tool-free one as plain content. Choices interleave as
they are produced (each chunk names its `index`); usage, when asked for, follows the last
choice's final chunk; `data: [DONE]` always ends the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from server import errors, openai_format
from server.chat import ChatRequest, render
from server.choices import response_frames
from server.generation import events, supersede
from server.openai_format import Shape, chat_chunk, tool_delta
from server.sse import event
from server.state import ServerState
from server.tool_calls import CHOSE_NO_TOOL, ToolStream, parse_call
from server.tools import Tool, next_call_id
from tgix.engine.request import Completion

Frame = bytes | Completion  # a choice's frames, then its Completion (for the usage chunk)


async def _content(
    st: ServerState, chat: ChatRequest, prompt: str, shape: Shape, index: int
) -> AsyncIterator[Frame]:
    hold, first = openai_format.StopHoldback(chat.params.stop), True
    async with aclosing(events(st, prompt, chat.params, add_special_tokens=False)) as stream:
        async for ev, final in stream:
            piece = "" if ev is None or ev.token.special else ev.token.text
            text = hold.push(piece)
            logprob_ev = ev if chat.logprobs else None
            reason = None
            if final is not None:
                text += hold.finish(final)
                reason = openai_format.finish_reason(final)
            chunk = chat_chunk(text, shape, index=index, first=first, ev=logprob_ev, reason=reason)
            yield event(chunk)
            first = False
            if final is not None:
                yield final


async def _tool_call(
    st: ServerState, chat: ChatRequest, prompt: str, shape: Shape, index: int
) -> AsyncIterator[Frame]:
    """Tool-call chunks; `no_tool` re-runs the request without tools as plain content."""
    tool, call_id, chose_no_tool = ToolStream(), next_call_id(chat.call_ids), False
    async with aclosing(events(st, prompt, chat.params, add_special_tokens=False)) as stream:
        async for ev, final in stream:
            token = None if ev is None else ev.token
            try:
                deltas = tool.push(
                    "" if token is None else token.text, bool(token and token.special)
                )
                if final is not None and deltas != CHOSE_NO_TOOL:
                    deltas += tool.end()
            except ValueError:  # not a call the grammar writes: reported at the end
                deltas, tool.state = [], "broken"
            if deltas == CHOSE_NO_TOOL:
                chose_no_tool = True
                await supersede(stream)
                break
            logprob_ev = ev if chat.logprobs else None
            for name, arguments in deltas:
                delta = tool_delta(call_id, name, arguments)
                first = name is not None
                yield event(chat_chunk(delta, shape, index=index, first=first, ev=logprob_ev))
                logprob_ev = None
            if final is not None:
                if not tool.done:
                    parse_call(final.generated_text)  # the route's tool_error (cut short)
                    raise errors.tool("Failed to parse generated text: not a tool call")
                reason = openai_format.finish_reason(final, tool_call=True)
                yield event(chat_chunk({}, shape, index=index, reason=reason))
                yield final
    if chose_no_tool:
        plain = chat.without_tools()
        st.metrics.count.inc()  # a second generation, as TGI counts it
        prompt = await st.validator.run(render, plain, None)
        async for frame in _content(st, plain, prompt, shape, index):
            yield frame


async def chat_frames(
    st: ServerState,
    chat: ChatRequest,
    prompt: str,
    offered: list[Tool] | None,
    shape: Shape,
) -> AsyncIterator[bytes]:
    """Every frame of one streamed chat completion, `data: [DONE]` last."""
    frames = _content if offered is None else _tool_call
    choices = [frames(st, chat.for_choice(j), prompt, shape, j) for j in range(chat.n)]
    usage = "chat.completion.chunk" if chat.include_usage else None
    async for frame in response_frames(choices, shape, usage):
        yield frame
