"""Grammars end to end on the REAL engine (the session's tiny llama, tests/server/real_engine.py):
a random model held to a regex or a JSON Schema answers text that matches it and ends with
EOS where the grammar is complete, streamed or not; chat `response_format` and the tool
grammar hold too, and a grammar the compiler refuses is a 422 while the server keeps serving."""

from __future__ import annotations

import json
import re

import pytest

from server.tool_calls import parse_call
from server.tools import grammar, offered, parse_tools
from tests.server.real_engine import PROMPT, client_for, idle_around

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "unit": {"enum": ["c", "f"]}},
    "required": ["ok", "unit"],
    "additionalProperties": False,
}
UNIT_TOOL = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}},
            "required": ["unit"],
        },
    },
}


@pytest.fixture
def live(real_engine):
    yield from idle_around(real_engine)


@pytest.fixture
def http(live):
    yield from client_for(live)


def _generate(http, grammar, *, stream=False, max_new_tokens=50):
    params = {"max_new_tokens": max_new_tokens, "details": True, "grammar": grammar}
    path = "/generate_stream" if stream else "/generate"
    return http.post(path, json={"inputs": PROMPT, "parameters": params})


def test_regex_and_json_schema_hold(live, http):
    r = _generate(http, {"type": "regex", "value": "[0-9]{3}"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert re.fullmatch("[0-9]{3}", out["generated_text"]), out
    assert out["details"]["finish_reason"] == "eos_token"
    assert out["details"]["tokens"][-1]["special"] is True

    streamed = _generate(http, {"type": "regex", "value": "[0-9]{3}"}, stream=True)
    frames = [json.loads(f[6:]) for f in streamed.text.split("\n\n") if f]
    assert [f["token"]["id"] for f in frames] == [t["id"] for t in out["details"]["tokens"]]
    assert frames[-1]["generated_text"] == out["generated_text"]

    r = _generate(http, {"type": "json", "value": SCHEMA})
    out = r.json()
    value = json.loads(out["generated_text"])
    assert set(value) == {"ok", "unit"} and isinstance(value["ok"], bool)
    assert value["unit"] in ("c", "f")
    assert out["details"]["finish_reason"] == "eos_token"


def test_a_refused_grammar_is_a_422_and_the_server_keeps_serving(live, http):
    r = _generate(http, {"type": "regex", "value": "(("})
    assert r.status_code == 422
    assert r.json()["error_type"] == "validation"
    assert r.json()["error"].startswith("Input validation error: ")
    r = _generate(http, {"type": "regex", "value": "(yes|no)"}, max_new_tokens=10)
    assert r.status_code == 200 and r.json()["generated_text"] in ("yes", "no")


def test_chat_response_format_and_the_tool_grammar_hold(live, http):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live.url}/v1", api_key="-")
    reply = client.chat.completions.create(
        model="tgi",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    )
    assert set(json.loads(reply.choices[0].message.content)) == {"ok", "unit"}
    assert reply.choices[0].finish_reason == "stop"

    # the prompt of a chat with tools does not fit this engine's 40 input tokens: the same
    # grammar on /generate, read back as the chat route reads it
    tools = offered(parse_tools([UNIT_TOOL]), "auto")
    r = _generate(http, grammar(tools))
    name, arguments = parse_call(r.json()["generated_text"])
    assert (name, arguments) in (
        ("no_tool", "{}"),
        ("set_unit", '{"unit":"c"}'),
        ("set_unit", '{"unit":"f"}'),
    )


class _RendersTools:
    """The session's engine behind a tokenizer whose chat template takes `tools` (so only the
    short tool prompt is appended and a tool chat fits 40 input tokens)."""

    def __init__(self, engine):
        import copy

        from tgix.testing import CHAT_TEMPLATE

        self._engine = engine
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.tokenizer.hf.chat_template = "{% if tools %}{% endif %}" + CHAT_TEMPLATE

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_chat_tool_calls_end_to_end(live):
    """A tool without arguments keeps the answer inside this engine's 64 tokens however the
    random model spells it."""
    from openai import OpenAI

    from server.app import build_app
    from server.args import parse_args
    from tests.server.conftest import LiveServer
    from tests.server.real_engine import ARGV

    app = build_app(_RendersTools(live.engine), parse_args(ARGV, environ={}))
    server = LiveServer(app, live.engine)
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="-")
        request = dict(
            model="tgi",
            messages=[{"role": "user", "content": "Hi"}],
            tools=[{"type": "function", "function": {"name": "u", "parameters": {}}}],
            tool_choice="required",
            extra_body={"tool_prompt": "T"},
            temperature=0,
        )
        reply = client.chat.completions.create(**request)
        (call,) = reply.choices[0].message.tool_calls
        assert (call.id, call.function.name, call.function.arguments) == ("0", "u", "{}")
        assert reply.choices[0].message.content is None
        assert reply.choices[0].finish_reason == "tool_calls"
        chunks = list(client.chat.completions.create(**request, stream=True))
        calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
        assert calls[0].function.name == "u" and calls[0].id == "0"
        assert "".join(c.function.arguments for c in calls) == "{}"  # = the non-streamed string
        reasons = [c.choices[0].finish_reason for c in chunks]
        assert reasons == [None] * (len(chunks) - 1) + ["tool_calls"]  # TGI: never one
    finally:
        server.stop()
