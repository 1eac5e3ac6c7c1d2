"""Engine results -> OpenAI-compatible JSON as TGI shapes it (§2.6, §2.7), plus stop-sequence
hold-back for streams.

Key order follows TGI's structs (`object` first: serde's internally tagged enums). On these
routes a matched stop sequence is cut from the returned text, and `finish_reason` uses
OpenAI's words (`stop` for EOS and stop sequences, `length`), as OpenAI clients expect; TGI's
own routes keep both the stop text and TGI's reasons.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from server.jsonio import f32
from tgix.engine.request import Completion, TokenEvent, TokenInfo
from tgix.engine.stop_match import StopMatcher


@dataclass(frozen=True, slots=True)
class Shape:
    """What every object of one response repeats: its id (one per response, shared by a
    stream's chunks), model, creation time and system fingerprint."""

    id: str
    model: str
    created: int
    fingerprint: str


def new_id(prefix: str) -> str:
    """A unique response id, OpenAI's way (`chatcmpl-...`, `cmpl-...`; TGI sends "")."""
    return f"{prefix}-{uuid.uuid4().hex}"


def header(obj: str, shape: Shape) -> dict[str, Any]:
    """The keys every OpenAI object starts with, in OpenAI's order."""
    return {
        "object": obj,
        "id": shape.id,
        "created": shape.created,
        "model": shape.model,
        "system_fingerprint": shape.fingerprint,
    }


def finish_reason(c: Completion, *, tool_call: bool = False) -> str:
    """OpenAI's words: `length`, `tool_calls` for a call (TGI: `stop`), else `stop`."""
    if c.finish_reason == "length":
        return "length"
    return "tool_calls" if tool_call else "stop"


def visible_text(c: Completion) -> str:
    """generated_text without the stop sequence that ended it (and anything after it)."""
    text = c.generated_text
    if c.finish_reason == "stop_sequence" and c.stop_sequence:
        cut = text.find(c.stop_sequence)
        if cut >= 0:
            return text[:cut]
    return text


def usage(completions: list[Completion]) -> dict[str, int]:
    prompt = sum(c.input_length for c in completions)
    generated = sum(c.generated_tokens for c in completions)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
    }


def _logprob(t: TokenInfo, top: tuple[TokenInfo, ...]) -> dict[str, Any]:
    return {
        "token": t.text,
        "logprob": f32(t.logprob),
        "top_logprobs": [{"token": x.text, "logprob": f32(x.logprob)} for x in top],
    }


def logprobs(c: Completion) -> dict[str, Any]:
    tops = list(c.top_tokens) + [()] * (len(c.tokens) - len(c.top_tokens))
    return {"content": [_logprob(t, top) for t, top in zip(c.tokens, tops, strict=False)]}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of a message's `tool_calls` as TGI writes it (`arguments` a JSON string)."""
    function = {"description": None, "name": name, "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def tool_delta(call_id: str, name: str | None, arguments: str) -> dict[str, Any]:
    """A streamed chunk's delta for a piece of a tool call: the first piece (with the name)
    carries the call's id, type and name, later pieces only the index and argument text,
    as OpenAI streams them (clients that merge pieces by concatenation rely on that)."""
    if name is None:
        return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
    call = {"index": 0, "id": call_id, "type": "function"}
    return {"tool_calls": [{**call, "function": {"name": name, "arguments": arguments}}]}


def chat_completion(
    completions: list[Completion],
    shape: Shape,
    *,
    with_logprobs: bool,
    tool_calls: list[list[dict[str, Any]] | None],
) -> dict[str, Any]:
    """A chat.completion with one choice per Completion; a choice with tool calls has them
    and no `content` key."""
    choices = []
    for i, (c, calls) in enumerate(zip(completions, tool_calls, strict=True)):
        message: dict[str, Any] = {"role": "assistant"}
        if calls is None:
            message["content"] = visible_text(c)
        else:
            message["tool_calls"] = calls
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs(c) if with_logprobs else None,
                "finish_reason": finish_reason(c, tool_call=calls is not None),
            }
        )
    return {**header("chat.completion", shape), "choices": choices, "usage": usage(completions)}


def chat_chunk(
    delta: str | dict[str, Any],
    shape: Shape,
    *,
    index: int = 0,
    first: bool = False,
    ev: TokenEvent | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """One chat.completion.chunk of choice `index`: `delta` is the content text or a ready
    delta (tool_delta); the choice's `first` chunk says the role (OpenAI's framing: TGI
    repeats it, which clients that merge deltas by concatenation turn into "assistantassistant");
    `ev` adds its logprobs, `reason` marks the choice's last chunk."""
    if isinstance(delta, str):
        delta = {"content": delta}
    if first:
        delta = {"role": "assistant", **delta}
    return {
        **header("chat.completion.chunk", shape),
        "choices": [
            {
                "index": index,
                "delta": delta,
                "logprobs": None
                if ev is None
                else {"content": [_logprob(ev.token, ev.top_tokens)]},
                "finish_reason": reason,
            }
        ],
        "usage": None,
    }


def usage_chunk(completions: list[Completion], shape: Shape, obj: str) -> dict[str, Any]:
    """The stream's last chunk with `stream_options.include_usage`: every choice summed."""
    return {**header(obj, shape), "choices": [], "usage": usage(completions)}


class StopHoldback:
    """Streams text without ever sending part of a stop sequence: text that could still
    become a stop match is held until the next token decides, and dropped if it matches.
    Linear in the stops' and the text's lengths (tgix.engine.stop_match)."""

    def __init__(self, stops: list[str]):
        self._matcher = StopMatcher(stops)
        self.text = ""  # everything the engine produced so far, up to a match
        self.sent = 0  # how much of it went out
        self._cut: int | None = None  # where the matched stop begins

    def push(self, piece: str) -> str:
        """Add a token's text; returns what can be sent now (maybe "")."""
        if self._cut is None:
            match = self._matcher.feed(piece)
            if match is None:
                self.text += piece
                end = len(self.text) - self._matcher.partial
            else:
                stop, offset = match
                self.text += piece[:offset]
                self._cut = end = len(self.text) - len(stop)
        else:
            end = self._cut
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out

    def finish(self, c: Completion) -> str:
        """The rest of the text once the request has ended, minus any matched stop."""
        end = len(self.text)
        if c.finish_reason == "stop_sequence" and self._cut is not None:
            end = max(self._cut, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out
