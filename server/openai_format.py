"""Engine results -> OpenAI-compatible JSON as TGI shapes it (§2.6, §2.7), plus stop-sequence
hold-back for streams.

Key order follows TGI's structs (`object` first: serde's internally tagged enums). On these
routes a matched stop sequence is cut from the returned text, and `finish_reason` uses
OpenAI's words (`stop` for EOS and stop sequences, `length`), as OpenAI clients expect; TGI's
own routes keep both the stop text and TGI's reasons.
"""

from __future__ import annotations

from typing import Any

from server.jsonio import f32
from server.tools import compact
from tgix.engine.request import Completion, TokenEvent, TokenInfo


def _header(obj: str, *, model: str, created: int, fingerprint: str) -> dict[str, Any]:
    """The keys every OpenAI object starts with, in OpenAI's order."""
    return {
        "object": obj,
        "id": "",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
    }


def finish_reason(c: Completion) -> str:
    return "length" if c.finish_reason == "length" else "stop"


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


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One entry of a message's `tool_calls` as TGI writes it (`arguments` a JSON string)."""
    function = {"description": None, "name": name, "arguments": compact(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def tool_delta(call_id: str, name: str | None, arguments: str) -> dict[str, Any]:
    """A streamed chunk's delta for a piece of a tool call (§8.4)."""
    call = {"index": 0, "id": call_id, "type": "function"}
    return {
        "role": "assistant",
        "tool_calls": [{**call, "function": {"name": name, "arguments": arguments}}],
    }


def chat_completion(
    c: Completion,
    *,
    model: str,
    created: int,
    fingerprint: str,
    with_logprobs: bool,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat.completion; with `tool_calls` the message has them and no `content` key."""
    message: dict[str, Any] = {"role": "assistant"}
    if tool_calls is None:
        message["content"] = visible_text(c)
    else:
        message["tool_calls"] = tool_calls
    return {
        **_header("chat.completion", model=model, created=created, fingerprint=fingerprint),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs(c) if with_logprobs else None,
                "finish_reason": finish_reason(c),
            }
        ],
        "usage": usage([c]),
    }


def chat_chunk(
    delta: str | dict[str, Any],
    *,
    model: str,
    created: int,
    fingerprint: str,
    ev: TokenEvent | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """One chat.completion.chunk: `delta` is the content text or a ready delta (tool_delta);
    `ev` adds its logprobs, `reason` marks the last one."""
    if isinstance(delta, str):
        delta = {"role": "assistant", "content": delta}
    return {
        **_header("chat.completion.chunk", model=model, created=created, fingerprint=fingerprint),
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None
                if ev is None
                else {"content": [_logprob(ev.token, ev.top_tokens)]},
                "finish_reason": reason,
            }
        ],
        "usage": None,
    }


def usage_chunk(c: Completion, *, model: str, created: int, fingerprint: str) -> dict[str, Any]:
    return {
        **_header("chat.completion.chunk", model=model, created=created, fingerprint=fingerprint),
        "choices": [],
        "usage": usage([c]),
    }


def text_completion(
    completions: list[Completion], *, model: str, created: int, fingerprint: str
) -> dict[str, Any]:
    return {
        **_header("text_completion", model=model, created=created, fingerprint=fingerprint),
        "choices": [
            {
                "index": i,
                "text": visible_text(c),
                "logprobs": None,
                "finish_reason": finish_reason(c),
            }
            for i, c in enumerate(completions)
        ],
        "usage": usage(completions),
    }


def completion_chunk(
    index: int,
    text: str,
    *,
    model: str,
    created: int,
    fingerprint: str,
    final: Completion | None = None,
) -> dict[str, Any]:
    """TGI's streamed text_completion event: `finish_reason` "" until the prompt's last
    event, which also carries that prompt's `usage`."""
    out: dict[str, Any] = {
        "object": "text_completion",
        "id": "",
        "created": created,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": "" if final is None else finish_reason(final),
            }
        ],
        "model": model,
        "system_fingerprint": fingerprint,
    }
    if final is not None:
        out["usage"] = usage([final])
    return out


class StopHoldback:
    """Streams text without ever sending part of a stop sequence: text that could still
    become a stop match is held until the next token decides, and dropped if it matches."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.text = ""  # everything the engine produced so far
        self.sent = 0  # how much of it went out

    def _safe_end(self) -> int:
        text = self.text
        for stop in self.stops:
            hit = text.find(stop)
            if hit >= 0:
                return hit
        end = len(text)
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    end = min(end, len(text) - k)
                    break
        return end

    def push(self, piece: str) -> str:
        """Add a token's text; returns what can be sent now (maybe "")."""
        self.text += piece
        if not self.stops:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        end = max(self._safe_end(), self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out

    def finish(self, c: Completion) -> str:
        """The rest of the text once the request has ended, minus any matched stop."""
        end = len(self.text)
        if c.finish_reason == "stop_sequence":
            end = max(self._safe_end() if self.stops else end, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out
