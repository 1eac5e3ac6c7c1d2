"""Grammar on the TGI routes and chat `response_format` (§8.1, §8.5) over the fake engine:
each accepted shape reaches the engine as a compiled grammar (FakeCompiler), every refusal
has TGI's status and exact body (inside a 200 SSE stream on streaming routes), and a grammar
that fails to compile never disturbs another request."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.fake_grammar import FakeIndex
from tgix.grammar import GrammarSpec

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SCHEMA_TEXT = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
NOT_SUPPORTED = (
    b'{"error":"Input validation error: grammar is not supported","error_type":"validation"}'
)
USER = [{"role": "user", "content": "Hi"}]


def _validation(message: str) -> bytes:
    return f'{{"error":"Input validation error: {message}","error_type":"validation"}}'.encode()


def _oai(message: str, error_type: str = "validation") -> dict:
    """/v1/*'s error body (the OpenAI SDK's shape) for a 422."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": 422}}


GENERATE_GRAMMARS = [
    ({"type": "json", "value": SCHEMA}, GrammarSpec("json", SCHEMA_TEXT)),
    ({"type": "json", "value": SCHEMA_TEXT}, GrammarSpec("json", SCHEMA_TEXT)),
    ({"type": "json_object", "value": SCHEMA}, GrammarSpec("json", SCHEMA_TEXT)),
    ({"type": "json", "value": {"type": "array"}}, GrammarSpec("json", '{"type":"array"}')),
    ({"type": "json", "value": True}, GrammarSpec("json", "true")),
    (  # TGI's documented example has no "type": it is read as an object, as TGI does
        {"type": "json", "value": {"properties": {"a": {"type": "string"}}}},
        GrammarSpec("json", '{"type":"object","properties":{"a":{"type":"string"}}}'),
    ),
    (
        {"type": "json", "value": {"anyOf": [{"type": "null"}], "properties": {}}},
        GrammarSpec("json", '{"anyOf":[{"type":"null"}],"properties":{}}'),
    ),
    (
        {"type": "json_schema", "value": {"name": "thing", "schema": SCHEMA, "strict": True}},
        GrammarSpec("json", SCHEMA_TEXT),
    ),
    ({"type": "regex", "value": "[0-9]{3}"}, GrammarSpec("regex", "[0-9]{3}")),
]


@pytest.mark.parametrize(("grammar", "spec"), GENERATE_GRAMMARS)
def test_each_grammar_type_reaches_the_engine(http, live, grammar, spec):
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 5, "grammar": grammar}}
    r = http.post("/generate", json=body)
    assert (r.status_code, r.content) == (200, b'{"generated_text":"Hi"}')
    (request,) = live.engine.submitted
    assert request.grammar == FakeIndex(spec)
    r = http.post("/", json=body)
    assert (r.status_code, r.content) == (200, b'[{"generated_text":"HiHi"}]')  # full text
    assert live.engine.submitted[1].grammar == FakeIndex(spec)


def test_no_grammar_no_index(http, live):
    http.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 1}})
    assert live.engine.submitted[0].grammar is None
    assert live.engine.grammar_compiler.specs == []


REFUSED = [
    ({"type": "json", "value": 5}, _validation("grammar is not supported")),
    ({"type": "json", "value": None}, _validation("grammar is not supported")),
    ({"type": "json", "value": [1]}, _validation("grammar is not supported")),
    ({"type": "json", "value": "5"}, _validation("grammar is not supported")),
    (
        {"type": "json", "value": "{nope"},
        _validation(
            "grammar is not valid: Expecting property name enclosed in double quotes "
            "at line 1 column 2"
        ),
    ),
    (
        {"type": "regex", "value": "BAD+"},
        _validation("cannot compile regex grammar: BAD is not allowed"),
    ),
    (
        {"type": "json", "value": {"const": "BAD"}},
        _validation("cannot compile json grammar: BAD is not allowed"),
    ),
]


@pytest.mark.parametrize(("grammar", "body"), REFUSED)
def test_refused_grammars_are_tgis_422(http, live, grammar, body):
    params = {"max_new_tokens": 5, "grammar": grammar}
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.content) == (422, body)
    r = http.post("/generate_stream", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.content) == (200, b"data: " + body + b"\n\n")
    r = http.post("/", json={"inputs": "Hi", "parameters": params, "stream": True})
    assert (r.status_code, r.content) == (200, b"data: " + body + b"\n\n")
    assert live.engine.submitted == []


@pytest.mark.parametrize(
    ("grammar", "text"),
    [
        ({"type": "json"}, "parameters.grammar: missing field `value`"),
        (
            {"type": "regex", "value": 1},
            "parameters.grammar.value: invalid type: integer `1`, expected a string",
        ),  # fmt: skip
        (
            {"type": "json_schema", "value": {"name": "x"}},
            "parameters.grammar.value: missing field `schema`",
        ),  # fmt: skip
        (
            {"type": "json_schema", "value": "x"},
            'parameters.grammar.value: invalid type: string "x", expected struct JsonSchemaConfig',
        ),  # fmt: skip
        (
            {"type": "text"},
            "parameters.grammar.type: unknown variant `text`, expected one of "
            "`json`, `json_object`, `json_schema`, `regex`",
        ),  # fmt: skip
    ],
)
def test_malformed_grammar_objects_are_plain_text_422(http, grammar, text):
    r = http.post("/generate", json={"inputs": "Hi", "parameters": {"grammar": grammar}})
    assert (r.status_code, r.text) == (422, DESERIALIZE + text)


def test_grammar_is_checked_last(http):
    params = {"max_new_tokens": 300, "grammar": {"type": "regex", "value": "BAD"}}
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert "`inputs` tokens + `max_new_tokens` must be <= 256" in r.json()["error"]


def test_disable_grammar_support(make_client):
    client, engine = make_client(disable_grammar_support=True)
    params = {"max_new_tokens": 2, "grammar": {"type": "json", "value": SCHEMA}}
    r = client.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.content) == (422, NOT_SUPPORTED)
    r = client.post("/generate_stream", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.content) == (200, b"data: " + NOT_SUPPORTED + b"\n\n")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    tool_request = {"tools": tools, "tool_choice": "required", "tool_prompt": "x"}
    for extra in ({"response_format": {"type": "json_object"}}, tool_request):
        r = client.post("/v1/chat/completions", json={"messages": USER, **extra})
        message = "Input validation error: grammar is not supported"
        assert (r.status_code, r.json()) == (422, _oai(message))
        r = client.post("/v1/chat/completions", json={"messages": USER, "stream": True, **extra})
        assert r.status_code == 200
        assert r.text == (
            'data: {"error":{"message":"Input validation error: grammar is not supported",'
            '"http_status_code":422}}\n\ndata: [DONE]\n\n'
        )
    assert engine.submitted == [] and engine.grammar_compiler.specs == []
    # requests without a grammar are unaffected
    ok = [
        client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
        client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}),
        client.post(
            "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 2, "tools": tools, "tool_choice": "none"},
        ),
        client.post(
            "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 2, "response_format": {"type": "text"}},
        ),
    ]
    assert [r.status_code for r in ok] == [200] * 4


def test_engine_without_a_compiler_refuses_grammars(make_client):
    engine = FakeEngine()
    engine.grammar_compiler = None
    client, _ = make_client(engine)
    params = {"grammar": {"type": "regex", "value": "a"}}
    r = client.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.content) == (422, NOT_SUPPORTED)


def test_a_broken_compiler_is_a_424(make_client):
    engine = FakeEngine()

    async def broken(spec):
        raise RuntimeError("worker died")

    engine.grammar_compiler.compile_async = broken
    client, _ = make_client(engine)
    r = client.post("/generate", json={"inputs": "Hi", "parameters": {"grammar": SCHEMA_GRAMMAR}})
    assert r.status_code == 424
    assert r.json() == {
        "error": "Request failed during generation: grammar compilation failed: worker died",
        "error_type": "generation",
    }


SCHEMA_GRAMMAR = {"type": "json", "value": SCHEMA}

RESPONSE_FORMATS = [
    ({"type": "json", "value": SCHEMA}, GrammarSpec("json", SCHEMA_TEXT)),
    ({"type": "json_object", "value": SCHEMA_TEXT}, GrammarSpec("json", SCHEMA_TEXT)),
    ({"type": "json_object"}, GrammarSpec("json", '{"type":"object"}')),
    ({"type": "json_schema", "value": {"schema": SCHEMA}}, GrammarSpec("json", SCHEMA_TEXT)),
    (
        {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}},
        GrammarSpec("json", SCHEMA_TEXT),
    ),
    ({"type": "regex", "value": "yes|no"}, GrammarSpec("regex", "yes|no")),
    ({"type": "text"}, None),
]


@pytest.mark.parametrize(("response_format", "spec"), RESPONSE_FORMATS)
def test_chat_response_format_shapes(http, live, response_format, spec):
    body = {"messages": USER, "max_tokens": 3, "response_format": response_format}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "<|u"}
    (request,) = live.engine.submitted
    assert request.grammar == (None if spec is None else FakeIndex(spec))


def test_chat_response_format_errors(http):
    def post(response_format, stream=False):
        body = {"messages": USER, "response_format": response_format, "stream": stream}
        return http.post("/v1/chat/completions", json=body)

    r = post({"type": "xml"})
    message = (
        DESERIALIZE + "response_format.type: unknown variant `xml`, expected one of `json`, "
        "`json_object`, `json_schema`, `regex`, `text`"
    )
    assert (r.status_code, r.json()) == (422, _oai(message, "invalid_request_error"))
    r = post({"type": "json_schema", "json_schema": {"name": "t"}})
    message = DESERIALIZE + "response_format.json_schema: missing field `schema`"
    assert r.json() == _oai(message, "invalid_request_error")
    r = post({"type": "json", "value": {"enum": ["BAD"]}})
    message = "Input validation error: cannot compile json grammar: BAD is not allowed"
    assert (r.status_code, r.json()) == (422, _oai(message))
    r = post({"type": "json", "value": {"enum": ["BAD"]}}, stream=True)
    assert r.text == (
        'data: {"error":{"message":"Input validation error: cannot compile json grammar: BAD is '
        'not allowed","http_status_code":422}}\n\ndata: [DONE]\n\n'
    )


def test_a_failing_compile_does_not_disturb_concurrent_requests(http, live):
    """Compilations overlap (each takes 0.3 s); the failing one answers 422 alone while the
    others, streamed or not, finish with their normal bytes."""
    live.engine.grammar_compiler.delay = 0.3
    good = {"type": "regex", "value": "H.*"}
    bad = {"type": "regex", "value": "BAD"}

    def generate(grammar):
        params = {"max_new_tokens": 5, "grammar": grammar}
        return http.post("/generate", json={"inputs": "Hi", "parameters": params})

    def stream(grammar):
        params = {"max_new_tokens": 1, "grammar": grammar}
        return http.post("/generate_stream", json={"inputs": "Hi", "parameters": params})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [
            pool.submit(generate, good),
            pool.submit(generate, bad),
            pool.submit(stream, good),
            pool.submit(stream, bad),
        ]
        ok, failed, ok_stream, failed_stream = [j.result() for j in jobs]
    assert (ok.status_code, ok.content) == (200, b'{"generated_text":"Hi"}')
    error = _validation("cannot compile regex grammar: BAD is not allowed")
    assert (failed.status_code, failed.content) == (422, error)
    assert ok_stream.text.replace(":\n\n", "") == (  # keep-alives while compiling
        'data: {"index":1,"token":{"id":82,"text":"H","logprob":-1.53,"special":false},'
        '"generated_text":"H","details":null}\n\n'
    )
    assert failed_stream.content.replace(b":\n\n", b"") == b"data: " + error + b"\n\n"
    assert len(live.engine.submitted) == 2
    assert all(r.grammar == FakeIndex(GrammarSpec.regex("H.*")) for r in live.engine.submitted)


def test_a_grammar_that_takes_too_long_to_reach_is_a_429(http, live, monkeypatch):
    """A request waits at most COMPILE_DEADLINE_S for its grammar (queue and compile), then
    gets the overload answer; the server keeps serving."""
    from server import grammar as server_grammar

    monkeypatch.setattr(server_grammar, "COMPILE_DEADLINE_S", 0.2)
    live.engine.grammar_compiler.delay = 1.0
    params = {"max_new_tokens": 2, "grammar": {"type": "regex", "value": "H.*"}}
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert (r.status_code, r.json()) == (
        429,
        {"error": "Model is overloaded", "error_type": "overloaded"},
    )
    live.engine.grammar_compiler.delay = 0.0
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert r.status_code == 200
    time.sleep(1.0)  # the abandoned compile finishes in the background
