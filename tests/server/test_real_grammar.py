"""The server with the REAL GrammarCompiler (one worker process) on the test tokenizer, over
the fake engine: every grammar shape compiles to a TokenIndex on the request, the compiler's
own errors come back as TGI's 422 byte for byte (an SSE event when streaming), the tool
grammar compiles, and a failing compile leaves concurrent requests alone."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from server.app import build_app
from server.grammar import to_spec
from server.metrics import StepRecorder
from server.settings import Settings
from server.tools import grammar, offered, parse_tools
from tests.server.conftest import LiveServer
from tests.server.fake_engine import FakeEngine, roomy_limits
from tgix.grammar import GrammarError, GrammarSpec, TokenIndex
from tgix.grammar.pushdown import PushdownIndex

INDEXES = (TokenIndex, PushdownIndex)  # compiled grammars (pushdown: unbounded nesting)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from transformers import AutoTokenizer

    from tgix.grammar import GrammarCompiler
    from tgix.testing import write_test_tokenizer
    from tgix.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    write_test_tokenizer(path)
    hf = AutoTokenizer.from_pretrained(str(path))
    compiler = GrammarCompiler.for_tokenizer(hf, eos_ids=(hf.eos_token_id,), workers=1)
    engine = FakeEngine(roomy_limits())
    engine.tokenizer = Tokenizer(hf)
    engine.grammar_compiler = compiler
    app = build_app(engine, Settings(), steps=StepRecorder(), keep_alive_s=5)
    server = LiveServer(app, engine)
    yield server
    server.stop()
    compiler.close()


@pytest.fixture
def http(real):
    real.engine.knobs.replies.clear()
    real.engine.submitted.clear()
    with httpx.Client(base_url=real.url, timeout=60) as client:
        yield client
    real.wait_idle()


def _generate(http, grammar, stream=False):
    params = {"max_new_tokens": 2, "grammar": grammar}
    return http.post(
        "/generate_stream" if stream else "/generate", json={"inputs": "Hi", "parameters": params}
    )


def _error(real, spec: GrammarSpec) -> bytes:
    """TGI's 422 body for the compiler's own message about `spec`."""
    with pytest.raises(GrammarError) as info:
        real.engine.grammar_compiler.compile(spec)
    body = {"error": f"Input validation error: {info.value}", "error_type": "validation"}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "grammar",
    [
        {"type": "regex", "value": "[0-9]{3}"},
        {"type": "json", "value": SCHEMA},
        {"type": "json_schema", "value": {"name": "n", "schema": SCHEMA}},
        {"type": "json_object", "value": json.dumps(SCHEMA)},
    ],
)
def test_grammars_compile_onto_the_request(real, http, grammar):
    r = _generate(http, grammar)
    assert r.status_code == 200
    (request,) = real.engine.submitted
    assert isinstance(request.grammar, INDEXES)


@pytest.mark.parametrize(
    "spec",
    [GrammarSpec.regex("(("), GrammarSpec.json({"type": "array", "uniqueItems": True})],
)
def test_compiler_errors_are_tgis_422(real, http, spec):
    body = _error(real, spec)
    grammar = {"type": spec.kind, "value": spec.schema() if spec.kind == "json" else spec.value}
    r = _generate(http, grammar)
    assert (r.status_code, r.content) == (422, body)
    r = _generate(http, grammar, stream=True)
    assert (r.status_code, r.content) == (200, b"data: " + body + b"\n\n")
    assert real.engine.submitted == []


def test_the_tool_grammar_compiles(real, http):
    for choice in ("auto", "required", ("function", "get_weather")):
        tools = offered(parse_tools([WEATHER]), choice)
        assert isinstance(real.engine.grammar_compiler.compile(to_spec(grammar(tools))), INDEXES)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    body = {"messages": messages, "tools": [WEATHER], "max_tokens": 8}
    r = http.post("/v1/chat/completions", json=body)
    assert r.json()["error"]["type"] == "tool_error"  # the fake engine echoes; no call comes back
    assert isinstance(real.engine.submitted[0].grammar, INDEXES)


def test_a_failing_compile_leaves_concurrent_requests_alone(real, http):
    plain = http.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    real.engine.submitted.clear()
    bad = {"type": "regex", "value": "(("}
    goods = [{"type": "regex", "value": f"[a-z]{{{n}}}"} for n in (5, 6, 7)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(_generate, http, g) for g in (goods[0], bad, goods[1], goods[2])]
        responses = [j.result() for j in jobs]
    assert [r.status_code for r in responses] == [200, 422, 200, 200]
    assert responses[1].content == _error(real, GrammarSpec.regex("(("))
    assert all(r.content == plain.content for i, r in enumerate(responses) if i != 1)
    assert len(real.engine.submitted) == 3
    assert all(isinstance(r.grammar, INDEXES) for r in real.engine.submitted)
