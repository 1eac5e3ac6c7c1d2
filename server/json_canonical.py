"""A streaming JSON re-writer: characters of one JSON value in, its compact canonical text
out, as soon as each piece is settled (so what has been sent never changes).

Canonical is what `json.dumps(value, ensure_ascii=False, separators=(",", ":"))` writes for
the parsed value (TGI's serde_json writes the same): no whitespace between tokens; strings
with only `"`, `\\` and control characters escaped (`\\n`, `\\u001f`, ...), escapes such as
`\\u00e9` or `\\/` decoded; numbers as Python spells the parsed value (`1.50` -> `1.5`,
`1E2` -> `100.0`), kept as written when that would not be finite. Keys stay in order (a
repeated key is kept twice, where json.loads would keep the last). Input is trusted to be
valid JSON (the grammar guarantees it); a character that cannot continue a value raises
ValueError.
"""

from __future__ import annotations

import json

_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER = frozenset("+-.0123456789eE")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


def string_char(ch: str) -> str:
    """One decoded character as it appears inside a canonical JSON string."""
    if ch in _SHORT:
        return _SHORT[ch]
    if ch < " " or "\ud800" <= ch <= "\udfff":  # control, or a lone surrogate kept escaped
        return f"\\u{ord(ch):04x}"
    return ch


def _number(text: str) -> str:
    value = json.loads(text)
    out = json.dumps(value)
    return text if out in ("Infinity", "-Infinity", "NaN") else out


class StringDecoder:
    """The body of a JSON string after its opening quote: feed characters, get decoded
    characters; `closed` once the closing quote is seen."""

    def __init__(self) -> None:
        self.closed = False
        self._escape: str | None = None  # "" after a backslash, "uXXX" while reading \u
        self._high: str | None = None  # a pending high surrogate

    def feed(self, ch: str) -> str:
        if self._escape is None:
            if ch == "\\":
                self._escape = ""
                return ""
            if ch == '"':
                self.closed = True
                return self._flush_high()
            return self._flush_high() + ch
        if self._escape == "":
            if ch == "u":
                self._escape = "u"
                return ""
            self._escape = None
            return self._flush_high() + _ESCAPES[ch]
        self._escape += ch
        if len(self._escape) < 5:
            return ""
        code, self._escape = int(self._escape[1:], 16), None
        if self._high is not None and 0xDC00 <= code <= 0xDFFF:
            pair = 0x10000 + ((ord(self._high) - 0xD800) << 10) + code - 0xDC00
            self._high = None
            return chr(pair)
        out = self._flush_high()
        if 0xD800 <= code <= 0xDBFF:
            self._high = chr(code)
            return out
        return out + chr(code)

    def _flush_high(self) -> str:
        high, self._high = self._high, None
        return high or ""


class CanonicalValue:
    """One JSON value, written canonically as it streams. `feed(ch)` returns (text to emit,
    consumed): consumed is False for the character right after a number, which ends the
    value and belongs to whatever follows it. `done` once the value is complete."""

    def __init__(self) -> None:
        self.done = False
        self._stack: list[str] = []  # open containers: "{" or "["
        self._string: StringDecoder | None = None
        self._number: str | None = None
        self._literal: str | None = None  # the rest of true/false/null still expected
        self._started = False

    def feed(self, ch: str) -> tuple[str, bool]:
        if self._string is not None:
            decoded = self._string.feed(ch)
            out = "".join(string_char(c) for c in decoded)
            if self._string.closed:
                self._string = None
                return out + '"' + self._after_scalar(), True
            return out, True
        if self._number is not None:
            if ch in _NUMBER:
                self._number += ch
                return "", True
            text, self._number = _number(self._number), None
            if not self._stack:  # the value ends here; `ch` belongs to what follows
                self.done = True
                return text, False
            rest, _ = self.feed(ch)  # `ch` continues the container the number was in
            return text + rest, True
        if self._literal:
            if ch != self._literal[0]:
                raise ValueError(f"unexpected {ch!r} in a literal")
            self._literal = self._literal[1:]
            return ch + ("" if self._literal else self._after_scalar()), True
        if ch.isspace():
            return "", True
        return self._token(ch), True

    def end(self) -> str:
        """The input ended: a number still open is complete (it needs no terminator)."""
        if self._number is not None and not self._stack:
            text, self._number = _number(self._number), None
            self.done = True
            return text
        return ""

    def _token(self, ch: str) -> str:
        if self.done:
            raise ValueError(f"unexpected {ch!r} after a complete value")
        self._started = True
        if ch in "{[":
            self._stack.append(ch)
            return ch
        if ch in "}]":
            if not self._stack or "{[".index(self._stack[-1]) != "}]".index(ch):
                raise ValueError(f"unbalanced {ch!r}")
            self._stack.pop()
            return ch + self._after_scalar()
        if ch in ",:":
            if not self._stack:
                raise ValueError(f"unexpected {ch!r}")
            return ch
        if ch == '"':
            self._string = StringDecoder()
            return '"'
        if ch in _NUMBER:
            self._number = ch
            return ""
        if ch in _LITERALS:
            self._literal = _LITERALS[ch][1:]
            return ch
        raise ValueError(f"unexpected {ch!r}")

    def _after_scalar(self) -> str:
        if not self._stack:
            self.done = True
        return ""
