"""Framework-level behaviour (§2.1, §4): malformed bodies are 4xx plain text and never 5xx,
415/413, 404/405, API key, CORS, health, /info, /v1/models, OpenAPI and /metrics."""

from __future__ import annotations

import socket

import pytest

from tests.server.fake_engine import FakeEngine

PARSE = "Failed to parse the request body as JSON: "
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b"{", 400, PARSE + "expecting property name enclosed in double quotes at line 1 column 2"),
        (b"", 400, PARSE + "expecting value at line 1 column 1"),
        (b'{"inputs": NaN}', 400, PARSE + "expected value (NaN is not JSON)"),
        (b'{"inputs": "\\ud83d"}', 400, PARSE + "lone surrogate in hex escape"),
        (b'{"inputs": "\xff\xfe"}', 400, PARSE + "invalid unicode code point at byte 12"),
        (b"[" * 100000, 400, PARSE + "recursion limit exceeded"),
        (
            b'"just a string"',
            422,
            DESERIALIZE + 'invalid type: string "just a string", expected struct GenerateRequest',
        ),
        (b"{}", 422, DESERIALIZE + "missing field `inputs`"),
        (
            b'{"inputs": 5}',
            422,
            DESERIALIZE + "inputs: invalid type: integer `5`, expected a string",
        ),
        (
            b'{"inputs": "a", "parameters": {"top_p": "x"}}',
            422,
            DESERIALIZE + 'parameters.top_p: invalid type: string "x", expected f32',
        ),
        (
            b'{"inputs": "a", "parameters": {"max_new_tokens": -1}}',
            422,
            DESERIALIZE + "parameters.max_new_tokens: invalid value: integer `-1`, expected u32",
        ),
        (
            b'{"inputs": "a", "parameters": {"details": null}}',
            422,
            DESERIALIZE + "parameters.details: invalid type: null, expected a boolean",
        ),
        (
            b'{"inputs": "a", "parameters": {"stop": ["a", 1]}}',
            422,
            DESERIALIZE + "parameters.stop[1]: invalid type: integer `1`, expected a string",
        ),
        (
            b'{"inputs": "a", "parameters": {"grammar": {"type": "xml", "value": 1}}}',
            422,
            DESERIALIZE + "parameters.grammar.type: unknown variant `xml`, expected one of `json`, "
            "`json_object`, `json_schema`, `regex`",
        ),
    ],
)
def test_malformed_bodies_are_plain_text_4xx(http, body, status, text):
    for path in ("/generate", "/generate_stream"):
        r = http.post(path, content=body, headers=JSON)
        assert (r.status_code, r.text) == (status, text)
        assert r.headers["content-type"].startswith("text/plain")


def test_content_type_and_payload_limit(make_client):
    client, engine = make_client(payload_limit=100)
    r = client.post("/generate", content=b'{"inputs": "Hi"}')
    assert (r.status_code, r.text) == (
        415,
        "Expected request with `Content-Type: application/json`",
    )
    r = client.post("/generate", content=b'{"inputs":"a"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415
    ok = client.post(
        "/generate",
        content=b'{"inputs":"a"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200
    big = b'{"inputs": "' + b"x" * 200 + b'"}'
    r = client.post("/generate", content=big, headers=JSON)
    assert (r.status_code, r.text) == (
        413,
        "Failed to buffer the request body: length limit exceeded",
    )

    def chunks():  # no content-length: the limit is enforced while reading
        yield big[:50]
        yield big[50:]

    r = client.post("/v1/chat/completions", content=chunks(), headers=JSON)
    assert r.status_code == 413
    assert len(engine.submitted) == 1


def test_payload_limit_on_a_real_socket(live):
    """413 from the announced length, before the body is read."""
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as s:
        s.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 3000000\r\n\r\n"
        )
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")


def test_unknown_route_and_method(http):
    r = http.get("/nope")
    assert (r.status_code, r.content) == (404, b"")
    r = http.get("/generate")
    assert (r.status_code, r.content) == (405, b"")


def test_api_key(make_client):
    client, engine = make_client(api_key="s3cret")
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}
    for path, method in [
        ("/generate", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/info", "GET"),
        ("/metrics", "GET"),
        ("/v1/models", "GET"),
        ("/tokenize", "POST"),
        ("/nope", "GET"),
        ("/generate/", "POST"),
        ("//generate", "POST"),
    ]:
        for auth in (None, "Bearer wrong", "Bearer S3CRET", "s3cret", "Basic s3cret"):
            headers = {"authorization": auth} if auth else {}
            r = client.request(method, path, json=body, headers=headers)
            if path.startswith("/v1/"):  # OpenAI's error body (TGI: empty), same status
                error = {"message": "Unauthorized", "type": "authentication_error"}
                assert r.status_code == 401 and r.json() == {
                    "error": {**error, "param": None, "code": 401}
                }, (path, auth)
            else:
                assert (r.status_code, r.content) == (401, b""), (path, auth)
    assert engine.submitted == []
    assert (
        client.post("/generate", json=body, headers={"authorization": "Bearer s3cret"}).status_code
        == 200
    )
    assert client.get("/info", headers={"authorization": "bearer s3cret"}).status_code == 200
    for path in ("/health", "/ping", "/"):
        assert client.get(path).status_code == 200  # probes stay open


def test_cors_only_when_configured(make_client):
    plain, _ = make_client()
    r = plain.options(
        "/generate", headers={"origin": "http://evil", "access-control-request-method": "POST"}
    )
    assert "access-control-allow-origin" not in r.headers
    r = plain.get("/info", headers={"origin": "http://evil"})
    assert "access-control-allow-origin" not in r.headers

    cors, _ = make_client(cors_allow_origin=("http://app.example",))
    preflight = {"origin": "http://app.example", "access-control-request-method": "POST"}
    r = cors.options("/generate", headers=preflight)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert set(r.headers["access-control-allow-methods"].split(", ")) == {"GET", "POST"}
    r = cors.options("/generate", headers={**preflight, "origin": "http://evil"})
    assert r.status_code == 400
    r = cors.get("/info", headers={"origin": "http://app.example"})
    assert r.headers["access-control-allow-origin"] == "http://app.example"


def test_health(make_client):
    client, engine = make_client()
    for path in ("/health", "/ping", "/"):
        r = client.get(path)
        assert (r.status_code, r.content) == (200, b"")
    engine.healthy_flag = False
    for path in ("/health", "/ping", "/"):
        r = client.get(path)
        assert r.status_code == 503
        assert r.content == b'{"error":"unhealthy","error_type":"healthcheck"}'


def test_info_and_models(http):
    info = http.get("/info").json()
    assert list(info) == [
        "model_id",
        "model_sha",
        "model_pipeline_tag",
        "max_concurrent_requests",
        "max_best_of",
        "max_stop_sequences",
        "max_input_tokens",
        "max_total_tokens",
        "validation_workers",
        "max_client_batch_size",
        "speculate",
        "quantize",
        "kv_cache_dtype",
        "router",
        "version",
        "sha",
        "docker_label",
    ]
    assert info["model_id"] == "fake/echo" and info["max_concurrent_requests"] == 8
    assert (info["max_input_tokens"], info["max_total_tokens"]) == (200, 256)
    assert info["router"] == "text-generation-router" and info["max_client_batch_size"] == 3
    assert info["speculate"] == 0 and info["quantize"] is None
    r = http.get("/v1/models")
    assert r.content == (
        b'{"object":"list","data":[{"id":"fake/echo","object":"model","created":0,'
        b'"owned_by":"fake/echo"}]}'
    )


def test_openapi_lists_every_route(http, live):
    doc = http.get("/api-doc/openapi.json").json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == "Text Generation Inference"
    served = {r.path.replace(":path}", "}") for r in live.app.routes}
    served -= {"/api-doc/openapi.json", "/docs"}
    assert served == set(doc["paths"])
    for path_item in doc["paths"].values():
        for op in path_item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            ref = body.get("schema", {}).get("$ref")
            if ref:
                assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"]
    assert http.get("/docs").text.startswith("<!doctype html>")


def test_metrics_names_types_and_values(make_client):
    client, engine = make_client()
    client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    client.post("/generate", json={"inputs": "Hi", "parameters": {"top_p": 1}})
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    text = client.get("/metrics").text
    lines = set(text.splitlines())
    assert "# TYPE tgi_request_count counter" in lines
    assert "tgi_request_count 4.0" in lines  # a chat request counts twice, as in TGI
    assert "tgi_request_success 2.0" in lines
    assert 'tgi_request_failure{err="validation"} 1.0' in lines
    assert "tgi_batch_max_total_tokens 4096.0" in lines and "tgi_queue_size 0.0" in lines
    assert "# TYPE tgi_request_duration histogram" in lines
    assert 'tgi_request_duration_bucket{le="0.00015000000000000001"} 0.0' in lines
    assert "tgi_request_input_length_count 2.0" in lines
    assert 'tgi_request_generated_tokens_bucket{le="2.56"} 1.0' in lines
    assert "tgi_request_skipped_tokens_count 2.0" in lines  # no drafts: 0 each
    assert "tgi_request_skipped_tokens_sum 0.0" in lines
    assert not [line for line in lines if line.split(" ")[0].endswith(("_total", "_created"))]


def test_an_moe_engines_expert_load_is_one_gauge_per_expert(make_client, monkeypatch):
    client, engine = make_client()
    load = {"expert_0_last_step": 6.0, "expert_0_total": 30.0, "expert_1_last_step": 0.0,
            "expert_1_total": 12.0, "expert_imbalance": 2.0}  # fmt: skip
    plain = engine.stats
    monkeypatch.setattr(engine, "stats", lambda: {**plain(), **load})
    lines = set(client.get("/metrics").text.splitlines())
    assert "# TYPE tgix_expert_tokens gauge" in lines
    assert {'tgix_expert_tokens{expert="0"} 30.0', 'tgix_expert_tokens{expert="1"} 12.0'} <= lines
    assert 'tgix_expert_step_tokens{expert="1"} 0.0' in lines


def test_step_recorder_feeds_metrics(make_client):
    from server.app import build_app
    from server.metrics import StepRecorder, render
    from server.settings import Settings

    steps = StepRecorder()
    steps("prefill", 0.02, 3, 40)
    steps("decode", 0.001, 3, 3)
    steps("decode", 0.5, 3, 3, ok=False)
    steps.concat("chunking")
    text = render(steps.registry).decode()
    for line in (
        'tgi_batch_inference_count{method="decode"} 2.0',
        'tgi_batch_inference_success{method="prefill"} 1.0',
        'tgi_batch_inference_failure{method="decode"} 1.0',
        'tgi_batch_forward_duration_count{method="prefill"} 1.0',
        'tgi_batch_next_size_bucket{le="3.0"} 1.0',
        'tgi_batch_concat{reason="chunking"} 1.0',
    ):
        assert line in text.splitlines()
    app = build_app(FakeEngine(), Settings(), steps=steps)
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        assert 'tgi_batch_concat{reason="chunking"} 1.0' in client.get("/metrics").text
