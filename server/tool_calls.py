"""Chat tools, answer side (§8.3 step 5, §8.4): the model's `{"function": {"_name": ...,
...arguments}}` read back as an OpenAI tool call, whole or while it streams.

`parse_call` reads a finished answer (a 422 `tool_error` when it is not such an object, e.g.
cut short by `max_tokens`). `ToolStream` follows TGI's streaming rules: tokens are buffered
until the text so far, closed artificially, parses with a `_name`; then the first chunk
carries the function name and `arguments: "{"`, each later token is one chunk of raw argument
text, and the token that closes the object has its final `}` trimmed. Tokens after that are
not sent, so no tool chunk carries the EOS's `finish_reason`. `no_tool` ends the stream's
tool phase: the caller runs the request again without tools.
"""

from __future__ import annotations

import json
import re
from typing import Any

from server import errors
from server.fields import describe
from server.tools import NO_TOOL_NAME

CHOSE_NO_TOOL = "no_tool"  # ToolStream.push's answer when the model chose no tool
_TRAILING = re.compile(r"[\s,}]+\Z")


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


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """The called function's name and arguments, or TGI's 422 tool_error."""
    try:
        return _call(json.loads(text))
    except json.JSONDecodeError as exc:
        why = _json_why(exc, text)
    except ValueError as exc:
        why = str(exc)
    quoted = json.dumps(text, ensure_ascii=False)
    raise errors.tool(f"Failed to parse generated text: {why} {quoted}")


class ToolStream:
    """Token texts in, tool-call deltas out (TGI's ChatState for tools)."""

    def __init__(self) -> None:
        self.state = "buffering"  # -> "tool" once the name is known -> "done" once closed
        self.text = ""

    def push(self, text: str, special: bool = False) -> str | list[tuple[str | None, str | None]]:
        """CHOSE_NO_TOOL, or the deltas to send for this token: (function name or None, argument
        text); argument None means a special token inside the call (an empty content chunk,
        as TGI sends)."""
        if self.state == "done":
            return []
        self.text += text
        if self.state == "buffering":
            call = _try_call(_TRAILING.sub("", self.text) + "}}")
            if call is None:
                return []
            if call[0] == NO_TOOL_NAME:
                return CHOSE_NO_TOOL
            self.state = "tool"
            return [(call[0], "{")]
        if _try_call(self.text) is not None:
            self.state = "done"
            piece = text.rstrip()
            return [(None, piece[:-1] if piece.endswith("}") else piece)]
        return [(None, None if special else text)]
