"""Chat tools, answer side (§8.3 step 5, §8.4): the model's `{"function": {"_name": ...,
...arguments}}` read back as an OpenAI tool call, whole or while it streams.

`parse_call` reads a finished answer (a 422 `tool_error` when it is not such an object, e.g.
cut short by `max_tokens`). `ToolStream` reads it while it streams: the grammar fixes the
text's shape, so the scanner knows where the arguments start and streams them character by
character in canonical form; joined, the pieces equal the non-streamed `arguments` (TGI
instead buffers until a heuristic repair parses, and drops what it buffered). `no_tool` ends
the stream's tool phase: the caller runs the request again without tools.
"""

from __future__ import annotations

import json
from typing import Any

from server import errors
from server.fields import describe
from server.json_canonical import CanonicalValue, StringDecoder, string_char
from server.tools import NO_TOOL_NAME, compact

CHOSE_NO_TOOL = "no_tool"  # ToolStream.push's answer when the model chose no tool


def _call(value: Any) -> tuple[str, dict[str, Any]]:
    """(name, arguments in order) from a parsed `{"function": {"_name", ...}}`; ValueError
    with serde's wording otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"invalid type: {describe(value)}, expected struct Call")
    if "function" not in value:
        raise ValueError("missing field `function`")
    function = value["function"]
    if not isinstance(function, dict):
        raise ValueError(f"invalid type: {describe(function)}, expected struct ToolCall")
    if "_name" not in function:
        raise ValueError("missing field `_name`")
    name = function["_name"]
    if not isinstance(name, str):
        raise ValueError(f"invalid type: {describe(name)}, expected a string")
    return name, {k: v for k, v in function.items() if k != "_name"}


def _try_call(text: str) -> tuple[str, dict[str, Any]] | None:
    try:
        return _call(json.loads(text))
    except ValueError:  # JSONDecodeError is one
        return None


def _open_container(text: str) -> tuple[str, str, bool]:
    """At the end of truncated JSON: the innermost open container ("{", "[" or ""), the last
    significant character, and whether the text ends inside a string."""
    stack, last, in_string, escaped = [], "", False, False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
        elif ch == '"':
            in_string = True
        if not ch.isspace():
            last = ch
    return (stack[-1] if stack else ""), last, in_string


def _json_why(exc: json.JSONDecodeError, text: str) -> str:
    """serde_json's wording when the text just stops (the usual case: `max_tokens`), else
    Python's message; both with serde's "at line L column C"."""
    if exc.pos < len(text.rstrip()) and not exc.msg.startswith("Unterminated string"):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    container, last, in_string = _open_container(text)
    if in_string:
        what = "a string"
    elif last == ":" or (last in ",[" and container == "["):
        what = "a value"
    else:
        what = {"{": "an object", "[": "a list"}.get(container, "a value")
    line, column = text.count("\n") + 1, len(text) - (text.rfind("\n") + 1)
    return f"EOF while parsing {what} at line {line} column {column}"


def parse_call(text: str) -> tuple[str, str]:
    """The called function's name and its arguments as a JSON string (the same string a
    stream of the same text sends in pieces), or TGI's 422 tool_error."""
    try:
        name, members = _call(json.loads(text))
    except json.JSONDecodeError as exc:
        why = _json_why(exc, text)
    except ValueError as exc:
        why = str(exc)
    else:
        try:
            return name, arguments(text)
        except ValueError:  # valid JSON the grammar would not write (e.g. an extra key)
            return name, compact(members)
    quoted = json.dumps(text, ensure_ascii=False)
    raise errors.tool(f"Failed to parse generated text: {why} {quoted}")


class ToolStream:
    """Token texts in, tool-call deltas out, exact: the text the grammar forces,
    `{"function": {"_name": <name>, <arguments...>}}`, is scanned as it streams; once `_name`
    is complete the first delta carries the name and `{`, then every settled character of
    the other members, written canonically (server.json_canonical), and `}` when the
    function object closes. Joined, the argument pieces are exactly `arguments(text)`, the
    non-streamed answer's string. Members written before `_name` wait for it."""

    def __init__(self) -> None:
        self.state = "start"  # start, key, colon, open, member, member_colon, value, sep, done
        self.name: str | None = None
        self._key: StringDecoder | None = None
        self._key_text = ""
        self._members: list[list] = []  # [canonical text, complete] per argument member
        self._value: CanonicalValue | None = None
        self._name_value = ""  # the canonical text of `_name`'s value
        self._sent = [0, 0]  # members fully sent, characters of the next one sent
        self._announced = False  # the name (and "{") went out
        self._closed = False  # the final "}" went out

    @property
    def done(self) -> bool:
        return self.state == "done"

    def push(self, text: str, special: bool = False) -> str | list[tuple[str | None, str]]:
        """CHOSE_NO_TOOL, or the deltas this token completes: (name on the first, argument
        text). Special tokens (EOS) carry no call text."""
        if self.state in ("done", "broken") or special:
            return []
        for ch in text:
            self._feed(ch)
            if self.state == "done":
                break
        if self.name == NO_TOOL_NAME:
            return CHOSE_NO_TOOL
        return self._deltas()

    def end(self) -> list[tuple[str | None, str]]:
        """The generation ended: a number at the very end is complete."""
        if self._value is not None and self.state == "value":
            self._take(self._value.end())
        return self._deltas()

    def _feed(self, ch: str) -> None:
        if self._key is not None:
            self._key_text += self._key.feed(ch)
            if self._key.closed:
                self._key = None
                self.state = "colon" if self.state == "key" else "member_colon"
            return
        if self.state == "value":
            out, consumed = self._value.feed(ch)
            self._take(out)
            if self._value.done:
                self._value, self.state = None, "sep"
                if self._key_text == "_name":
                    self.name = json.loads(self._name_value)
                if not consumed:
                    self._feed(ch)
            return
        if ch.isspace():
            return
        state = self.state
        if state == "start" and ch == "{":
            self.state = "key"
        elif state in ("key", "member") and ch == '"':
            self._key, self._key_text = StringDecoder(), ""
        elif state == "colon" and ch == ":":
            if self._key_text != "function":
                raise ValueError(f"unexpected key {self._key_text!r} in a tool call")
            self.state = "open"
        elif state == "open" and ch == "{":
            self.state = "member"
        elif state == "member_colon" and ch == ":":
            self.state, self._value = "value", CanonicalValue()
            if self._key_text != "_name":
                key = "".join(string_char(c) for c in self._key_text)
                self._members.append([f'"{key}":', False])
        elif state == "sep" and ch == ",":
            self.state = "member"
        elif state in ("sep", "member") and ch == "}":
            if self.name is None:
                raise ValueError("the function object closed without `_name`")
            self.state = "done"
        else:
            raise ValueError(f"unexpected {ch!r} in a tool call")

    def _take(self, out: str) -> None:
        if self._key_text == "_name":
            self._name_value += out
        else:
            self._members[-1][0] += out

    def _deltas(self) -> list[tuple[str | None, str]]:
        if self.name is None:
            return []
        for member in self._members[:-1]:
            member[1] = True
        if self._members and (self.state != "value" or self._key_text == "_name"):
            self._members[-1][1] = True
        name, pieces = None, []
        if not self._announced:
            self._announced, name = True, self.name
            pieces.append("{")
        done, chars = self._sent
        while done < len(self._members):
            text, complete = self._members[done]
            if chars == 0 and done > 0:
                pieces.append(",")
            pieces.append(text[chars:])
            if not complete:
                chars = len(text)
                break
            done, chars = done + 1, 0
        self._sent = [done, chars]
        if self.state == "done" and not self._closed:
            self._closed = True
            pieces.append("}")
        piece = "".join(pieces)
        return [(name, piece)] if piece or name else []


def arguments(text: str) -> str:
    """The canonical arguments string of a complete call text (what ToolStream's pieces
    join to). Raises ValueError when the text is not a complete call."""
    stream = ToolStream()
    pieces = stream.push(text)
    if pieces == CHOSE_NO_TOOL:
        return "{}"
    pieces += stream.end()
    if not stream.done:
        raise ValueError("the tool call is incomplete")
    return "".join(p for _, p in pieces)
