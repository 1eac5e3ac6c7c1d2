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


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """The called function's name and arguments, or TGI's 422 tool_error."""
    try:
        return _call(json.loads(text))
    except json.JSONDecodeError as exc:
        why = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
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
