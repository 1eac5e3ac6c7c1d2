"""Incremental detokenization: the text each generated token adds, never half a character.

Decoding token by token is not the same as decoding the whole sequence: byte-level BPE tokens
can hold part of a multi-byte UTF-8 character (an emoji is often 2-4 tokens), and SentencePiece
decoders drop the leading space of the first token they see. TGI therefore decodes a short
window of ids twice: `prefix` = decode(window up to `read`) and `text` = decode(whole window),
and emits text[len(prefix):] once `text` is longer and does not end in U+FFFD (an unfinished
character decodes as U+FFFD). The window then moves on: its new start is the old `read`, so it
only ever spans the last emitted chunk plus the tokens held since, and each token costs two
decodes of a few ids, whatever the sequence length. The window starts with the last prompt
tokens (TGI uses 5), so the first generated token gets the leading space a decode of the whole
text would give it.

Beyond TGI: a held run of 4 or more tokens that still ends in U+FFFD is rarely one unfinished
character (those are at most 4 bytes) and usually replacement characters that are really in the
text (invalid bytes, or a U+FFFD the model wrote). TGI keeps growing the window until something
else follows; here the run is released up to the newest split point where decode(head) +
decode(tail) == decode(head + tail), which for byte-level decoders means the bytes before the
split can no longer change. That keeps the window, and the cost per token, bounded.

Host-only (no jax).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT_TOKENS = 5  # prompt ids seeding the window, as TGI's `prefix_offset`
_MAX_CHAR_BYTES = 4  # the longest UTF-8 character
_SPLIT_AFTER = _MAX_CHAR_BYTES  # held tokens before a run is checked for settled text
_SPLIT_CANDIDATES = 4  # split points tried, newest first, once a run is that long


class TokenDecoder(Protocol):
    """What the detokenizer needs from a tokenizer (tgix.tokenizer.Tokenizer fits)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Turns generated ids into text pieces, one `add` per id.

    `add` returns the text the id adds, special tokens kept (TGI's per-token `text`), or "" while
    the decoded text ends in an unfinished UTF-8 character; the held text comes out with the
    token that completes it. `flush` returns what is still held when the sequence ends, which
    for an unfinished character is U+FFFD, exactly as a full decode shows it.

    Guarantee (byte-level BPE decoders, e.g. GPT-2/Llama-3/Qwen/SmolLM2 tokenizers): with no
    prompt, "".join(add(i) for i in ids) + flush() == tokenizer.decode(ids), and every piece
    is the slice of that decode at its place. With a prompt the pieces are what
    decode(prompt + ids) adds after decode(prompt). SentencePiece byte-fallback decoders turn
    a whole run of byte tokens into U+FFFDs when any byte is invalid, so for them it holds for
    valid UTF-8 output only.
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_ids: Sequence[int] = (),
        *,
        context_tokens: int = PROMPT_CONTEXT_TOKENS,
    ):
        self._tokenizer = tokenizer
        tail = self._prompt_tail(list(prompt_ids), context_tokens)
        self._window: list[int] = tail  # ids from the window start; earlier ones are dropped
        self._read = len(tail)  # window[:read] is already emitted (or prompt context)
        self._prefix_text = self._decode(tail)

    def add(self, token_id: int) -> str:
        """Append one generated id; return the text it completes ("" while one is unfinished)."""
        self._window.append(token_id)
        text = self._decode(self._window)
        if len(text) > len(self._prefix_text) and not text.endswith(REPLACEMENT_CHAR):
            return self._advance(text, len(self._window))
        if len(self._window) - self._read >= _SPLIT_AFTER:
            return self._release_settled(text)
        return ""

    def peek(self, ids: Sequence[int]) -> str:
        """The text appending `ids` would add after what was emitted (held text included),
        without appending them: how far a draft's text reaches."""
        return self._decode([*self._window, *ids])[len(self._prefix_text) :]

    def flush(self) -> str:
        """The held remainder at the end of the sequence: "" or text ending in U+FFFD."""
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text):
            return ""
        return self._advance(text, len(self._window))

    def _prompt_tail(self, prompt_ids: list[int], context_tokens: int) -> list[int]:
        """The last `context_tokens` prompt ids, moved back (by at most 3) off a character's
        continuation bytes: byte-fallback decoders spoil a whole byte run that starts mid-way."""
        start = max(0, len(prompt_ids) - context_tokens)
        for _ in range(_MAX_CHAR_BYTES - 1):
            if start == 0 or not self._decode(prompt_ids[start:]).startswith(REPLACEMENT_CHAR):
                break
            start -= 1
        return prompt_ids[start:]

    def _release_settled(self, text: str) -> str:
        """Emit a long held run up to the newest split point that can no longer change."""
        newest = len(self._window) - 1
        oldest = max(self._read + 1, newest - _SPLIT_CANDIDATES + 1)
        for split in range(newest, oldest - 1, -1):
            head = self._decode(self._window[:split])
            if (
                len(head) > len(self._prefix_text)
                and head + self._decode(self._window[split:]) == text
            ):
                return self._advance(head, split)
        return ""

    def _advance(self, text: str, read: int) -> str:
        """Emit `text` beyond the prefix; the window now starts at the old read position."""
        piece = text[len(self._prefix_text) :]
        del self._window[: self._read]
        self._read = read - self._read
        self._prefix_text = self._decode(self._window[: self._read])
        return piece

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
