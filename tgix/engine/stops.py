"""Stop sequences on streamed tokens: hold back what may turn out to be a stop, cut at the match.

A stop sequence is matched on the decoded text, so it can span several tokens and end in the
middle of one. Tokens are streamed whole, so a token is held back while the text from it to the
end could still grow into a stop sequence; once a stop sequence appears, everything up to its
last character is released, the completing token's `text` is cut right after it, and the request
ends there. TGI keeps the stop text in the output, and so does this. (TGI itself streams every
token at once and only matches a stop that ends exactly at a token's end, its issue #1039; this
is the behaviour users asked for there.) Texts are token texts with special tokens kept, so a
stop can name a special token such as "<|im_end|>".

Only the held tail can contain a new match: a match starting earlier would have made its first
characters a held prefix. The held text is shorter than the longest stop sequence plus the
first held and the newest token, so each push costs O(longest stop), not O(text).

Host-only (no jax).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tgix.engine.request import TokenInfo


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
        self.stop_sequences: tuple[str, ...] = tuple(dict.fromkeys(s for s in stop_sequences if s))
        self._prefixes = {s[:n] for s in self.stop_sequences for n in range(1, len(s))}
        self._longest_prefix = max((len(s) - 1 for s in self.stop_sequences), default=0)
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
        new_text_start = len(self._held_text)
        self._held.append(token)
        self._held_text += token.text
        match = self._find_match(new_text_start)
        if match is not None:
            stop, end = match
            self.matched = stop
            cut = token.text[: end - new_text_start]
            self._held[-1] = dataclasses.replace(token, text=cut)
            self._held_text = self._held_text[:end]
            return self.flush()
        return self._release_before(self._hold_from())

    def flush(self) -> list[TokenInfo]:
        """Release every held token (the sequence ended for another reason, or matched)."""
        return self._release_before(len(self._held_text))

    def _find_match(self, new_text_start: int) -> tuple[str, int] | None:
        """(stop, end offset in the held text) of the first match ending in the new text."""
        best: tuple[int, int, str] | None = None  # (end, -len, stop): smallest wins
        for stop in self.stop_sequences:
            begin = self._held_text.find(stop, max(0, new_text_start - len(stop) + 1))
            if begin >= 0:
                candidate = (begin + len(stop), -len(stop), stop)
                best = candidate if best is None else min(best, candidate)
        return None if best is None else (best[2], best[0])

    def _hold_from(self) -> int:
        """Offset in the held text where its longest suffix that begins a stop sequence starts."""
        text = self._held_text
        for size in range(min(self._longest_prefix, len(text)), 0, -1):
            if text[-size:] in self._prefixes:
                return len(text) - size
        return len(text)

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
