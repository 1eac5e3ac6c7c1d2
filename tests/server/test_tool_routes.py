"""Chat tools over HTTP (§8.3, §8.4) on a fake engine with room for tool prompts: the request
the engine gets (grammar, prompt with TGI's tool text), `tool_calls` answers byte for byte,
streamed tool-call chunks with TGI's framing, `no_tool` re-runs, parse failures, call ids,
and the real OpenAI SDK reading both."""

from __future__ import annotations

import json
import random

import pytest

from server.app import build_app
from server.metrics import StepRecorder
from server.tools import DEFAULT_TOOL_PROMPT
from tests.server.conftest import LiveServer, make_settings
from tests.server.fake_engine import FakeEngine, roomy_limits
from tests.server.fake_grammar import FakeIndex
from tgix.grammar import GrammarSpec

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOLS_JSON = (
    '[{"type":"function","function":{"description":"Get the weather","name":"get_weather",'
    '"arguments":"{\\"type\\":\\"object\\",\\"properties\\":{\\"city\\":{\\"type\\":'
    '\\"string\\"}}}"}}]'
)
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"function": {"_name": "get_weather", "city": "Paris"}}'
CALL_PIECES = ['{"', "function", '":', ' {"', "_name", '":', ' "', "get_weather", '",', ' "']
CALL_PIECES += ["city", '":', ' "', "Paris", '"}}']
NO_TOOL_PIECES = ['{"function": {"_name": "no', "_tool", '"}}']
HEAD = '{"object":"chat.completion.chunk","id":"%s","created":%d,"model":"fake/echo",'
HEAD += '"system_fingerprint":"0.1.0-native","choices":'


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(roomy_limits())
    app = build_app(engine, make_settings(), steps=StepRecorder(), keep_alive_s=5)
    live = LiveServer(app, engine)
    yield live
    live.stop()


@pytest.fixture
def tool(server):
    server.engine.reset()
    yield server
    server.wait_idle()


def _post(server, **body):
    import httpx

    payload = {"messages": USER, "tools": [WEATHER], "max_tokens": 200, **body}
    return httpx.post(f"{server.url}/v1/chat/completions", json=payload, timeout=10)


def _prompt(request) -> str:
    return "".join(chr(i - 10) for i in request.prompt_ids)


def test_the_engine_gets_the_tool_grammar_and_prompt(tool):
    tool.engine.knobs.replies = [CALL]
    r = _post(tool, tool_choice="required")
    assert r.status_code == 200
    (request,) = tool.engine.submitted
    assert _prompt(request) == (
        f"<|user|>Weather in Paris?\n---\n{TOOLS_JSON}\n{DEFAULT_TOOL_PROMPT}\n<|assistant|>"
    )
    schema = {
        "type": "object",
        "$functions": {
            "get_weather": {
                "type": "object",
                "description": "Get the weather",
                "additionalProperties": False,
                "properties": {
                    "_name": {"type": "string", "const": "get_weather"},
                    "city": {"type": "string"},
                },
                "required": ["_name"],
            }
        },
        "properties": {"function": {"anyOf": [{"$ref": "#/$functions/get_weather"}]}},
        "required": ["function"],
        "additionalProperties": False,
    }
    assert request.grammar == FakeIndex(GrammarSpec.json(schema))
    assert tool.engine.tokenizer.template_tools == [
        {"type": "function", "function": WEATHER["function"]}
    ]


def test_non_streamed_tool_call_golden_bytes(tool):
    tool.engine.knobs.replies = [CALL]
    r = _post(tool, tool_prompt="Call a tool.")
    assert r.status_code == 200
    (request,) = tool.engine.submitted
    prompt_tokens, completion_tokens = len(request.prompt_ids), len(CALL) + 1  # + EOS
    assert r.text == (
        f'{{"object":"chat.completion","id":"{r.json()["id"]}","created":{r.json()["created"]},'
        '"model":"fake/echo","system_fingerprint":"0.1.0-native","choices":[{"index":0,'
        '"message":{"role":"assistant","tool_calls":[{"id":"0","type":"function","function":'
        '{"description":null,"name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}}]},'
        '"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":'
        f'{prompt_tokens},"completion_tokens":{completion_tokens},"total_tokens":'
        f"{prompt_tokens + completion_tokens}}}}}"
    )
    assert _prompt(request).endswith("\nCall a tool.\n<|assistant|>")
    assert '"name":"no_tool"' in _prompt(request)  # auto offers no_tool


def test_streamed_tool_call_golden_bytes(tool):
    tool.engine.knobs.replies = [CALL_PIECES]
    r = _post(tool, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    first = json.loads(r.text.split("\n\n")[0][6:])
    head = HEAD % (first["id"], first["created"])

    def chunk(delta, reason="null"):
        choice = f'[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{reason}}}]'
        return f'data: {head}{choice},"usage":null}}\n\n'

    def piece(arguments):  # OpenAI's framing: id, type and name in the first piece only
        call = f'{{"index":0,"function":{{"arguments":{json.dumps(arguments)}}}}}'
        return chunk(f'{{"tool_calls":[{call}]}}')

    (request,) = tool.engine.submitted
    n = len(request.prompt_ids)
    usage = f'"usage":{{"prompt_tokens":{n},"completion_tokens":16,"total_tokens":{n + 16}}}'
    call = (
        '{"index":0,"id":"0","type":"function","function":{"name":"get_weather","arguments":"{"}}'
    )
    # the model's tokens, whitespace and all: ' "', "city", '":', ' "', "Paris", '"}}'
    pieces = ['"city":', '"', "Paris", '"}']  # canonical: no spaces; the call's "}" kept
    assert r.text == (
        chunk(f'{{"role":"assistant","tool_calls":[{call}]}}')
        + "".join(piece(p) for p in pieces)
        + chunk("{}", '"tool_calls"')
        + f"data: {head}[],{usage}}}\n\n"
        + "data: [DONE]\n\n"
    )
    assert "{" + "".join(pieces) == '{"city":"Paris"}'  # the non-streamed `arguments`


@pytest.mark.parametrize("stream", [False, True])
def test_no_tool_runs_the_request_again_without_tools(tool, stream):
    tool.engine.knobs.replies = [NO_TOOL_PIECES, "OK"]
    r = _post(tool, stream=stream, tool_prompt="Call a tool.")
    assert r.status_code == 200
    first, second = tool.engine.submitted
    assert first.grammar is not None and second.grammar is None
    assert _prompt(second) == "<|user|>Weather in Paris?\n<|assistant|>"
    if not stream:
        choice = r.json()["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": "OK"}
        assert choice["finish_reason"] == "stop"
        assert r.json()["usage"]["completion_tokens"] == 3
        return
    events = [json.loads(f[6:]) for f in r.text.split("\n\n")[:-2]]
    assert [e["choices"][0]["delta"] for e in events] == [
        {"role": "assistant", "content": "O"},  # the role in the first chunk only (OpenAI's)
        {"content": "K"},
        {"content": ""},
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert r.text.endswith("\n\ndata: [DONE]\n\n")


def test_an_answer_that_is_not_a_call_is_a_tool_error(tool):
    tool.engine.knobs.replies = [CALL]
    r = _post(tool, max_tokens=12)
    message = (
        "Tool error: Failed to parse generated text: EOF while parsing a value at "
        'line 1 column 12 "{\\"function\\":"'
    )
    assert (r.status_code, r.json()) == (
        422,
        {"error": {"message": message, "type": "tool_error", "param": None, "code": 422}},
    )
    tool.engine.knobs.replies = [CALL]
    r = _post(tool, max_tokens=12, stream=True)  # streamed: the same error, as an event
    error = {"error": {"message": message, "http_status_code": 422}}
    assert r.text == f"data: {json.dumps(error, separators=(',', ':'))}\n\ndata: [DONE]\n\n"


def test_tool_call_ids_follow_the_conversation(tool):
    earlier = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "4", "type": "function", "function": {"name": "f"}}],
    }
    messages = [*USER, earlier, {"role": "tool", "content": "sunny", "tool_call_id": "4"}, *USER]
    tool.engine.knobs.replies = [CALL, CALL_PIECES]
    r = _post(tool, messages=messages, tool_choice="get_weather")
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "5"
    r = _post(tool, messages=messages, tool_choice="get_weather", stream=True)
    assert '"tool_calls":[{"index":0,"id":"5","type":"function"' in r.text


def test_tool_choice_none_and_templates_that_render_tools(tool):
    r = _post(tool, tool_choice="none", max_tokens=2)
    (request,) = tool.engine.submitted
    assert request.grammar is None and "---" not in _prompt(request)
    assert r.json()["choices"][0]["message"]["content"] == "<|"
    tool.engine.tokenizer.chat_template = "{% if tools %}{{ tools }}{% endif %}"
    try:
        tool.engine.knobs.replies = [CALL]
        r = _post(tool, tool_prompt="Use them.")
        assert _prompt(tool.engine.submitted[1]) == (
            "<|user|>Weather in Paris?\n---\nUse them.\n<|assistant|>"
        )
        names = [t["function"]["name"] for t in tool.engine.tokenizer.template_tools]
        assert names == ["get_weather", "no_tool"]
    finally:
        tool.engine.tokenizer.chat_template = "fake"


def test_chat_tokenize_shows_the_tool_prompt(tool):
    import httpx

    body = {"messages": USER, "tools": [WEATHER], "tool_prompt": "T", "tool_choice": "required"}
    r = httpx.post(f"{tool.url}/chat_tokenize", json=body, timeout=10)
    assert r.json()["templated_text"] == (
        f"<|user|>Weather in Paris?\n---\n{TOOLS_JSON}\nT\n<|assistant|>"
    )


def test_openai_sdk_reads_tool_calls(tool):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tool.url}/v1", api_key="-")
    tool.engine.knobs.replies = [CALL, CALL_PIECES]
    reply = client.chat.completions.create(model="tgi", messages=USER, tools=[WEATHER])
    (call,) = reply.choices[0].message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "0",
        "get_weather",
        {"city": "Paris"},
    )
    chunks = list(
        client.chat.completions.create(model="tgi", messages=USER, tools=[WEATHER], stream=True)
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert deltas[0].function.name == "get_weather" and deltas[0].id == "0"
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "tool_calls"]


def test_huggingface_hub_response_formats_and_tool_calls(tool):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=tool.url, timeout=10)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for response_format in (
        {"type": "json", "value": schema},  # TGI's own shape
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},  # OpenAI's
    ):
        out = client.chat_completion(USER, max_tokens=3, response_format=response_format)
        assert out.choices[0].message.content == "<|u"
        assert tool.engine.submitted[-1].grammar == FakeIndex(GrammarSpec.json(schema))
    tool.engine.knobs.replies = [CALL, CALL_PIECES]
    out = client.chat_completion(USER, max_tokens=100, tools=[WEATHER], tool_choice="auto")
    (call,) = out.choices[0].message.tool_calls
    assert (call.id, call.function.name, call.function.arguments) == (
        "0",
        "get_weather",
        '{"city":"Paris"}',
    )
    chunks = list(client.chat_completion(USER, max_tokens=100, tools=[WEATHER], stream=True))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert calls[0].function.name == "get_weather"
    # the streamed pieces join to exactly the non-streamed string (TGI: '{ "city": "Paris"}')
    assert "".join(c.function.arguments for c in calls) == '{"city":"Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


_TOOLS = [
    WEATHER,
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "when": {"type": "string"},
                    "seats": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
]
_CALLS = [
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"city": 'Saint-\u00c9tienne "42"\n'}),
    ("book", {"when": "tomorrow, 9:00", "seats": 12, "tags": ["a", "b\\c"]}),
    ("book", {}),
]


@pytest.mark.parametrize("seed", range(12))
def test_streamed_tool_calls_join_to_the_non_streamed_arguments(tool, seed):
    """Any split of the model's text into tokens, any layout, every tool_choice that can
    call: the streamed pieces join to the non-streamed `arguments`, one finish_reason."""
    rng = random.Random(seed)
    name, arguments = _CALLS[seed % len(_CALLS)]
    separators = rng.choice([(", ", ": "), (",", ":")])
    text = json.dumps({"function": {"_name": name, **arguments}}, separators=separators)
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(3, 20))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    choice = rng.choice(
        ["auto", "required", name, {"type": "function", "function": {"name": name}}]
    )
    tool.engine.knobs.replies = [pieces, pieces]
    plain = _post(tool, tools=_TOOLS, tool_choice=choice)
    (call,) = plain.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == name
    assert json.loads(call["function"]["arguments"]) == json.loads(json.dumps(arguments))
    streamed = _post(tool, tools=_TOOLS, tool_choice=choice, stream=True)
    chunks = [json.loads(f[6:]) for f in streamed.text.split("\n\n")[:-2]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"]]
    assert calls[0]["function"]["name"] == name and calls[0]["id"] == call["id"]
    assert all("name" not in c["function"] for c in calls[1:])
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * (len(chunks) - 1) + ["tool_calls"]
