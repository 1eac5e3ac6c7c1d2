"""Tools without HTTP (§8.3, §8.4): the grammar TGI builds for each tool_choice, the prompt
text, call ids, reading a finished answer and TGI's streaming state machine (its own unit
test's token sequences)."""

from __future__ import annotations

import pytest

from server.errors import ApiError
from server.tool_calls import CHOSE_NO_TOOL, ToolStream, parse_call
from server.tools import (
    DEFAULT_TOOL_PROMPT,
    NO_TOOL,
    Tool,
    grammar,
    next_call_id,
    offered,
    parse_tool_choice,
    parse_tools,
    prompt_suffix,
    template_uses_tools,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
WEATHER_SCHEMA = {
    "type": "object",
    "description": "Get the weather",
    "additionalProperties": False,
    "properties": {
        "_name": {"type": "string", "const": "get_weather"},
        "city": {"type": "string"},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["_name", "city"],
}
NO_TOOL_SCHEMA = {
    "type": "object",
    "description": "Open ended response with no specific tool selected",
    "additionalProperties": False,
    "properties": {"_name": {"type": "string", "const": "no_tool"}},
    "required": ["_name"],
}


def _schema(functions: dict) -> dict:
    refs = [{"$ref": f"#/$functions/{name}"} for name in functions]
    return {
        "type": "json",
        "value": {
            "type": "object",
            "$functions": functions,
            "properties": {"function": {"anyOf": refs}},
            "required": ["function"],
            "additionalProperties": False,
        },
    }


def test_grammar_per_tool_choice():
    tools = parse_tools([WEATHER])
    auto = offered(tools, parse_tool_choice(None))
    assert auto == [*tools, NO_TOOL] and offered(tools, "auto") == auto
    assert grammar(auto) == _schema({"get_weather": WEATHER_SCHEMA, "no_tool": NO_TOOL_SCHEMA})
    assert grammar(offered(tools, "required")) == _schema({"get_weather": WEATHER_SCHEMA})
    named = offered(
        tools, parse_tool_choice({"type": "function", "function": {"name": "get_weather"}})
    )
    assert named == offered(tools, parse_tool_choice("get_weather")) == tools
    assert offered(tools, "none") is None and offered([], "auto") is None
    assert offered(None, "required") is None
    with pytest.raises(ApiError, match="Tool error: Tool with name nope not found"):
        offered(tools, ("function", "nope"))


def test_tool_schema_quirks():
    loose = Tool("f", None, {"properties": {"x": {}}, "additionalProperties": "true"})
    strict = Tool("g", "d", {"properties": {"x": {}}, "additionalProperties": True})
    functions = grammar([loose, strict, Tool("h", None, "not an object")])["value"]["$functions"]
    assert functions["f"]["additionalProperties"] is True  # only the string "true" opens it
    assert functions["g"]["additionalProperties"] is False
    assert functions["f"]["description"] == "" and functions["g"]["description"] == "d"
    assert functions["h"] == {
        "type": "object",
        "description": "",
        "properties": {"_name": {"type": "string", "const": "h"}},
        "required": ["_name"],
    }
    assert parse_tools([{"function": {"name": "p"}}]) == [Tool("p", None, {})]
    assert parse_tools([{"function": {"name": "a", "arguments": {"type": "object"}}}]) == [
        Tool("a", None, {"type": "object"})
    ]


def test_prompt_suffix_as_tgi_writes_it():
    tools = [*parse_tools([WEATHER]), NO_TOOL]
    assert prompt_suffix(tools, "P", uses_tools=True) == "\n---\nP"
    assert prompt_suffix(tools, DEFAULT_TOOL_PROMPT, uses_tools=False) == (
        '\n---\n[{"type":"function","function":{"description":"Get the weather","name":'
        '"get_weather","arguments":"{\\"type\\":\\"object\\",\\"properties\\":{\\"city\\":'
        '{\\"type\\":\\"string\\"},\\"unit\\":{\\"enum\\":[\\"c\\",\\"f\\"]}},\\"required\\":'
        '[\\"city\\"]}"}},{"type":"function","function":{"description":"Open ended response '
        'with no specific tool selected","name":"no_tool","arguments":"{\\"type\\":\\"object'
        '\\"}"}}]\n\nGiven the functions available, please respond with a JSON for a function '
        "call with its proper arguments that best answers the given prompt. Respond in the "
        "format {name: function name, parameters: dictionary of argument name and its value}."
        "Do not use variables.\n"
    )


def test_template_uses_tools():
    assert template_uses_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_uses_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_uses_tools("{% set tools = [] %}{{ tools }}")  # declared, not given
    assert template_uses_tools("{% generation %}{{ tools }}{% endgeneration %}")  # text search
    assert template_uses_tools({"default": "{{ messages }}", "tool_use": "{{ tools }}"})
    assert not template_uses_tools(None)


def test_next_call_id():
    assert next_call_id([]) == "0"
    assert next_call_id(["0", "7", "3"]) == "8"
    assert len(next_call_id(["call_abc"])) == 36  # a UUID


def test_parse_tool_choice_forms():
    assert [parse_tool_choice(v) for v in (None, "auto", "none", "required", "f")] == [
        "auto",
        "auto",
        "none",
        "required",
        ("function", "f"),
    ]
    with pytest.raises(Exception, match="tool_choice: data did not match any variant"):
        parse_tool_choice(5)


def test_parse_call():
    text = '{"function": {"_name": "get_weather", "unit": "c", "city": "Paris"}}'
    assert parse_call(text) == ("get_weather", '{"unit":"c","city":"Paris"}')
    cases = [
        ('{"function":', 'EOF while parsing a value at line 1 column 12 "{\\"function\\":"'),
        ("[1]", 'invalid type: sequence, expected struct Call "[1]"'),
        (
            '{"function": {"_name": "f", "a',
            "EOF while parsing a string at line 1 column 30 "
            '"{\\"function\\": {\\"_name\\": \\"f\\", \\"a"',
        ),  # fmt: skip
        (
            '{"function": {"_name": "f",',
            "EOF while parsing an object at line 1 column 27 "
            '"{\\"function\\": {\\"_name\\": \\"f\\","',
        ),  # fmt: skip
        ("x", 'Expecting value at line 1 column 1 "x"'),
        ('{"f": 1}', 'missing field `function` "{\\"f\\": 1}"'),
        ('{"function": {"a": 1}}', 'missing field `_name` "{\\"function\\": {\\"a\\": 1}}"'),
    ]
    for text, why in cases:
        with pytest.raises(ApiError) as info:
            parse_call(text)
        assert info.value.body() == {
            "error": f"Tool error: Failed to parse generated text: {why}",
            "error_type": "tool_error",
        }
        assert info.value.status == 422


def _push_all(stream: ToolStream, tokens: list[str]) -> list:
    return [stream.push(t) for t in tokens]


def test_tool_stream_sends_every_argument_character():
    """TGI's get_weather token sequence: the name once `_name` closes, then the arguments as
    they settle, canonical (no spaces), joined equal to the non-streamed string."""
    head = ['{"', "function", '":', ' {"', "_", "name", '":', ' "', "get", "_current", "_weather"]
    args = [' "', "location", '":', ' "', "San", " Francisco", ",", " CA", '",', ' "']
    args += ["format", '":', ' "', "c", "elsius", '"}}']
    stream = ToolStream()
    assert _push_all(stream, head) == [[]] * len(head)
    assert stream.push('",') == [("get_current_weather", "{")]
    out = [o for o in _push_all(stream, args) if o]
    assert all(len(o) == 1 and o[0][0] is None for o in out)
    assert [o[0][1] for o in out] == [
        '"location":', '"', "San", " Francisco", ",", " CA", '"', ',"format":', '"', "c",
        "elsius", '"}',
    ]  # fmt: skip
    text = "".join(head + ['",'] + args)
    assert "{" + "".join(o[0][1] for o in out) == parse_call(text)[1]
    assert parse_call(text)[1] == '{"location":"San Francisco, CA","format":"celsius"}'
    assert stream.done and stream.push("</s>", special=True) == []  # nothing after the call


def test_tool_stream_no_tool_and_special_tokens():
    tokens = ['{"', "function", '":', ' {"', "_", "name", '":', ' "', "no", "_tool"]
    stream = ToolStream()
    assert _push_all(stream, tokens) == [[]] * len(tokens)
    assert stream.push('",') == CHOSE_NO_TOOL
    stream = ToolStream()
    assert _push_all(stream, ['{"function":{"_name":"f"', ","]) == [[("f", "{")], []]
    assert stream.push("<x>", special=True) == []  # a special token carries no call text
    assert stream.push('"a":1}}') == [(None, '"a":1}')]


def test_arguments_before_the_name_wait_for_it():
    stream = ToolStream()
    assert stream.push('{"function": {"b": [1, 2.50], ') == []
    assert stream.push('"_name": "f", "c"') == [("f", '{"b":[1,2.5]')]
    assert stream.push(": null}}") == [(None, ',"c":null}')]


def test_tool_defs_are_kept_under_the_tool_name():
    item = {"type": "object", "properties": {"n": {"type": "integer"}}}
    params = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
        "required": ["items"],
        "$defs": {"Item": item, "Box": {"$ref": "#/definitions/Item"}},
    }
    schema = grammar([Tool("order", None, params)])["value"]
    assert schema["$defs"] == {"order.Item": item, "order.Box": {"$ref": "#/$defs/order.Item"}}
    assert schema["$functions"]["order"]["properties"]["items"] == {
        "type": "array",
        "items": {"$ref": "#/$defs/order.Item"},
    }
    assert "$defs" not in grammar(parse_tools([WEATHER]))["value"]
