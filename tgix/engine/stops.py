"""Stop sequences on streamed tokens: hold back what may turn out to be a stop, cut at the match.

A stop sequence is matched on the decoded text, so it can span several tokens and end in the
middle of one. Tokens are streamed whole, so a token is held back while the text from it to the
end could still grow into a stop sequence; once a stop sequence appears, everything up to its
last character is released, the completing token's `text` is cut right after it, and the request
ends there. TGI keeps the stop text in the output, and so does this. (TGI itself streams every
token at once and only matches a stop that ends exactly at a token's end, its issue #1039; this
is the behaviour users asked for there.) Texts are token texts with special tokens kept, so a
stop can name a special token such as "<|im_end|>".

Matching is tgix.engine.stop_match's: each stop advances one character at a time with its KMP
table, so a stop of n characters costs O(n) memory once and each pushed token O(its length x
stops), whatever the stops' lengths; the held text is what `partial` says may still grow into
a stop.

Host-only (no jax).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tgix.engine.request import TokenInfo
from tgix.engine.stop_match import StopMatcher


class StopBuffer:
    """Streams TokenInfos with stop-sequence hold-back for one sequence.

    push(token) -> tokens now safe to stream, in order (possibly none, possibly several).
    matched      the stop sequence that ended the text, or None.
    flush()      releases everything held (the request ended for another reason).
    text         all pushed text so far, cut at the end of the match.

    The earliest match wins: of all stop sequences the one whose last character comes first in
    the text, the longer one on a tie. So a stop sequence that extends another never fires.
    Empty stop strings are ignored. Pushing after a match is an error: the sequence is over.
    """

    def __init__(self, stop_sequences: Iterable[str] = ()):
        self._matcher = StopMatcher(stop_sequences)
        self.stop_sequences: tuple[str, ...] = self._matcher.stops
        self.matched: str | None = None
        self._released: list[str] = []  # texts of released tokens
        self._held: list[TokenInfo] = []
        self._held_text = ""

    @property
    def text(self) -> str:
        """Released plus held text; after a match it ends exactly with the stop sequence."""
        return "".join(self._released) + self._held_text

    @property
    def held(self) -> tuple[TokenInfo, ...]:
        """Tokens pushed but not yet released."""
        return tuple(self._held)

    def push(self, token: TokenInfo) -> list[TokenInfo]:
        """Add the next generated token; return the tokens that are now safe to stream."""
        if self.matched is not None:
            raise RuntimeError(f"stop sequence {self.matched!r} already matched")
        start = len(self._held_text)
        self._held.append(token)
        self._held_text += token.text
        match = self._matcher.feed(token.text)
        if match is not None:
            self.matched, end = match
            self._held[-1] = dataclasses.replace(token, text=token.text[:end])
            self._held_text = self._held_text[: start + end]
            return self.flush()
        return self._release_before(len(self._held_text) - self._matcher.partial)

    def completes_at(self, text: str) -> int | None:
        """Where in `text` (text after everything pushed) a stop would end, or None."""
        return self._matcher.peek(text)

    def flush(self) -> list[TokenInfo]:
        """Release every held token (the sequence ended for another reason, or matched)."""
        return self._release_before(len(self._held_text))

    def _release_before(self, offset: int) -> list[TokenInfo]:
        """Release the leading held tokens whose text ends at or before `offset`."""
        released: list[TokenInfo] = []
        end = 0
        for token in self._held:
            if end + len(token.text) > offset:
                break
            end += len(token.text)
            released.append(token)
        if released:
            del self._held[: len(released)]
            self._held_text = self._held_text[end:]
            self._released.extend(t.text for t in released)
        return released
