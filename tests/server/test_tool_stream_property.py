"""Streamed tool calls, property-based: for any arguments object, any JSON layout the model
might write and any split into tokens, the streamed argument pieces join to exactly the
non-streamed `arguments` string, which equals the arguments re-serialised compactly."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from server.tool_calls import ToolStream, parse_call
from server.tools import compact

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
_SCALARS = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | _TEXT
_SCALARS |= st.floats(allow_nan=False, allow_infinity=False)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_ARGUMENTS = st.dictionaries(_TEXT.filter(lambda k: k != "_name"), _VALUES, max_size=4)
_LAYOUTS = st.sampled_from([(", ", ": "), (",", ":"), (" ,  ", " :\t")])


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(["get_weather", "f", "a.b-c"]),
    arguments=_ARGUMENTS,
    layout=_LAYOUTS,
    ascii_only=st.booleans(),
    name_first=st.booleans(),
    cuts=st.lists(st.integers(0, 10**6), max_size=40),
)
def test_joined_pieces_equal_the_non_streamed_arguments(
    name, arguments, layout, ascii_only, name_first, cuts
):
    function = {"_name": name, **arguments} if name_first else {**arguments, "_name": name}
    text = json.dumps({"function": function}, separators=layout, ensure_ascii=ascii_only)
    got_name, whole = parse_call(text)
    assert got_name == name and whole == compact(arguments)
    stream, deltas = ToolStream(), []
    for piece in _split(text, cuts):
        deltas += stream.push(piece)
    deltas += stream.end()
    assert stream.done
    assert deltas[0][0] == name and all(n is None for n, _ in deltas[1:])
    assert "".join(piece for _, piece in deltas) == whole
