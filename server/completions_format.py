"""text_completion objects (POST /v1/completions) as OpenAI and vLLM write them.

A choice's `logprobs` is OpenAI's legacy shape: parallel lists `tokens`, `token_logprobs`,
`top_logprobs` (a dict token text -> logprob per token: the k best alternatives plus the
chosen token, so it may hold k + 1 entries, as in vLLM) and `text_offset` (where each token
starts in the choice's `text`). With `echo` the prompt's tokens come first; the first one is
unscored (null logprob, null alternatives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.jsonio import f32
from server.openai_format import Shape, finish_reason, header, usage, visible_text
from tgix.engine.request import Completion, TokenInfo


class TokenLogprobs:
    """Accumulates one choice's `logprobs` lists; `text_offset` counts from `start`."""

    def __init__(self, start: int = 0):
        self.offset = start
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token: TokenInfo, top: Sequence[TokenInfo] | None) -> None:
        """One token; `top` None for an unscored position (the prompt's first token)."""
        self.tokens.append(token.text)
        self.token_logprobs.append(None if token.logprob is None else f32(token.logprob))
        if top is None or token.logprob is None:
            self.top_logprobs.append(None)
        else:
            alternatives = {t.text: f32(t.logprob) for t in top}
            alternatives.setdefault(token.text, f32(token.logprob))
            self.top_logprobs.append(alternatives)
        self.text_offset.append(self.offset)
        self.offset += len(token.text)

    def add_all(self, tokens: Sequence[TokenInfo], tops: Sequence[Sequence[TokenInfo]]) -> None:
        padded = list(tops) + [()] * (len(tokens) - len(tops))
        for token, top in zip(tokens, padded, strict=False):
            self.add(token, top)

    def body(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


def choice_logprobs(c: Completion, *, echo: bool, score_only: bool) -> dict[str, Any]:
    """A finished choice's logprobs: the prompt's tokens first with `echo` (the first
    unscored), then the generated ones (none when only the prompt was scored)."""
    lists = TokenLogprobs()
    if echo:
        prompt_tops = list(c.prefill_top_tokens) or [()] * len(c.prefill)
        for i, (token, top) in enumerate(zip(c.prefill, prompt_tops, strict=False)):
            lists.add(token, None if i == 0 else top)
    if not score_only:
        lists.add_all(c.tokens, c.top_tokens)
    return lists.body()


def choice_text(c: Completion, prompt_text: str | None, score_only: bool) -> str:
    """The choice's text: the prompt first with `echo` (prompt_text not None)."""
    text = "" if score_only else visible_text(c)
    return text if prompt_text is None else prompt_text + text


def text_completion(
    choices: Sequence[tuple[Completion, str, dict[str, Any] | None]],
    shape: Shape,
    *,
    score_only: bool = False,
) -> dict[str, Any]:
    """The non-streamed answer: choices (completion, text, logprobs) in choice order; usage
    counts each prompt once per choice, as OpenAI does."""
    completions = [c for c, _, _ in choices]
    body_usage = usage(completions)
    if score_only:
        body_usage["total_tokens"] -= body_usage["completion_tokens"]
        body_usage["completion_tokens"] = 0
    return {
        **header("text_completion", shape),
        "choices": [
            {
                "index": i,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": "length" if score_only else finish_reason(c),
            }
            for i, (c, text, logprobs) in enumerate(choices)
        ],
        "usage": body_usage,
    }


def completion_chunk(
    index: int,
    text: str,
    shape: Shape,
    *,
    logprobs: dict[str, Any] | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """One streamed text_completion event of choice `index`; `reason` (OpenAI's words) only
    on the choice's last event (TGI: "" before it, and its own words at the end)."""
    return {
        **header("text_completion", shape),
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}],
        "usage": None,
    }
