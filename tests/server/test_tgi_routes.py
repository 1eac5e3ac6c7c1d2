"""Golden tests of TGI's own routes over a real uvicorn server: exact JSON bytes (key order,
float32 logprobs), exact SSE framing, headers, `/` compat and /tokenize."""

from __future__ import annotations

import json

import httpx

from tests.server.fake_engine import BOS, token_id

H = '{"id":82,"text":"H","logprob":-1.53,"special":false}'
I = '{"id":115,"text":"i","logprob":-1.53,"special":false}'  # noqa: E741
END = '{"id":2,"text":"</s>","logprob":-1.53,"special":true}'


def test_generate_without_details_is_text_only(http):
    r = http.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}})
    assert r.status_code == 200
    assert r.content == b'{"generated_text":"Hi"}'
    assert r.headers["content-type"] == "application/json"


def test_generate_details_golden_bytes_and_headers(http, live):
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 5, "details": True}}
    r = http.post("/generate", json=body)
    assert r.status_code == 200
    assert r.text == (
        '{"generated_text":"Hi","details":{"finish_reason":"eos_token","generated_tokens":3,'
        f'"seed":null,"prefill":[],"tokens":[{H},{I},{END}]}}}}'
    )
    h = r.headers
    assert h["x-prompt-tokens"] == "3" and h["x-generated-tokens"] == "3"
    assert h["x-compute-characters"] == "2" and h["x-compute-type"] == "gpu+optimized"
    assert h["x-queue-time"] == "1" and h["x-inference-time"] == "2"
    assert float(h["x-compute-time"]) > 0
    for name in ("x-total-time", "x-validation-time", "x-time-per-token"):
        assert h[name].isdigit()
    (request,) = live.engine.submitted
    assert request.prompt_ids == (BOS, token_id("H"), token_id("i"))  # special tokens added
    assert request.sampling.do_sample is False  # parameters given: greedy by default


def test_generate_length_stop_and_top_tokens(http):
    params = {"max_new_tokens": 2, "details": True, "top_n_tokens": 2}
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    details = r.json()["details"]
    assert list(details) == [
        "finish_reason",
        "generated_tokens",
        "seed",
        "prefill",
        "tokens",
        "top_tokens",
    ]
    assert details["finish_reason"] == "length" and details["generated_tokens"] == 2
    assert [t["text"] for t in details["top_tokens"][0]] == ["H", "I"]

    stop = {"max_new_tokens": 20, "details": True, "stop": ["ll"]}
    r = http.post("/generate", json={"inputs": "Hello", "parameters": stop})
    assert r.json()["generated_text"] == "Hell"  # TGI keeps the stop sequence
    assert r.json()["details"]["finish_reason"] == "stop_sequence"


def test_generate_return_full_text_best_of_and_prefill(http, live):
    params = {"max_new_tokens": 3, "return_full_text": True, "best_of": 2, "do_sample": True}
    r = http.post("/generate", json={"inputs": "ab", "parameters": {**params, "details": True}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["generated_text"] == "abab"
    assert list(out["details"]) == [
        "finish_reason",
        "generated_tokens",
        "seed",
        "prefill",
        "tokens",
        "best_of_sequences",
    ]
    (other,) = out["details"]["best_of_sequences"]
    assert other["generated_text"] == "abab" and list(other)[:2] == [
        "generated_text",
        "finish_reason",
    ]
    assert out["details"]["seed"] == 42  # sampling: the engine's seed is reported

    r = http.post(
        "/generate",
        json={"inputs": "ab", "parameters": {"decoder_input_details": True, "max_new_tokens": 1}},
    )
    assert r.json()["details"]["prefill"] == []  # without --enable-prefill-logprobs
    assert live.engine.submitted[-1].prompt_logprobs is False


def test_generate_without_parameters_samples(http, live):
    r = http.post("/generate", json={"inputs": "Hi"})
    assert r.status_code == 200 and r.json() == {"generated_text": "Hi"}
    assert live.engine.submitted[-1].sampling.do_sample is True  # TGI's default_parameters()


def test_generate_stream_golden_bytes(http):
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 5, "details": True}}
    with http.stream("POST", "/generate_stream", json=body) as r:
        raw = b"".join(r.iter_raw())
        headers = r.headers
    assert raw.decode() == (
        f'data: {{"index":1,"token":{H},"generated_text":null,"details":null}}\n\n'
        f'data: {{"index":2,"token":{I},"generated_text":null,"details":null}}\n\n'
        f'data: {{"index":3,"token":{END},"generated_text":"Hi","details":{{"finish_reason":'
        '"eos_token","generated_tokens":3,"seed":null,"input_length":3}}\n\n'
    )
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    assert headers["x-compute-characters"] == "2"


def test_generate_stream_without_details_and_with_top_tokens(http):
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, "top_n_tokens": 1}}
    with http.stream("POST", "/generate_stream", json=body) as r:
        raw = b"".join(r.iter_raw()).decode()
    assert raw == (
        f'data: {{"index":1,"token":{H},"top_tokens":[{H}],"generated_text":"H","details":null}}'
        "\n\n"
    )


def test_compat_route_array_and_stream(http):
    r = http.post("/", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}})
    assert r.status_code == 200
    assert r.content == b'[{"generated_text":"HiHi"}]'  # pipeline tag text-generation: full text

    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 5, "return_full_text": False}}
    r = http.post("/", json={**body, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line]
    assert r.headers["content-type"] == "text/event-stream"
    assert [e["index"] for e in events] == [1, 2, 3] and events[-1]["generated_text"] == "Hi"
    assert "[DONE]" not in r.text


def test_stream_errors_are_events_in_a_200(http, live):
    body = {"inputs": "Hi", "parameters": {"best_of": 2}}
    r = http.post("/generate_stream", json=body)
    assert r.status_code == 200
    assert r.text == (
        'data: {"error":"Input validation error: `best_of` != 1 is not supported when streaming '
        'tokens","error_type":"validation"}\n\n'
    )
    r = http.post(
        "/generate_stream", json={"inputs": "Hi", "parameters": {"decoder_input_details": True}}
    )
    assert "`decoder_input_details` == true is not supported" in r.text
    r = http.post("/generate_stream", json={"inputs": "Hi", "parameters": {"temperature": 0}})
    assert r.status_code == 200 and r.text.startswith('data: {"error":"Input validation error: ')
    assert live.engine.submitted == []


def test_generation_failure_mid_stream_and_non_stream(http, live):
    live.engine.knobs.fail_after = 1
    r = http.post("/generate_stream", json={"inputs": "Hello", "parameters": {"max_new_tokens": 5}})
    frames = r.text.split("\n\n")[:-1]
    assert len(frames) == 2 and frames[0].startswith('data: {"index":1,')
    assert frames[1] == (
        'data: {"error":"Request failed during generation: Server error: injected failure",'
        '"error_type":"generation"}'
    )
    r = http.post("/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 5}})
    assert r.status_code == 424
    assert r.json()["error_type"] == "generation"


def test_incomplete_generation(http, live):
    live.engine.knobs.incomplete = True
    r = http.post("/generate", json={"inputs": "Hi", "parameters": {}})
    assert r.status_code == 500
    assert r.content == b'{"error":"Incomplete generation","error_type":"incomplete_generation"}'
    r = http.post("/generate_stream", json={"inputs": "Hi", "parameters": {}})
    assert r.text.endswith(
        'data: {"error":"Incomplete generation stream","error_type":"incomplete_generation_stream"}'
        "\n\n"
    )


def test_late_completion_still_ends_with_a_final_event(http, live):
    live.engine.knobs.late_completion = True
    r = http.post("/generate_stream", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}})
    events = [json.loads(f[6:]) for f in r.text.split("\n\n") if f]
    assert events[-1]["generated_text"] == "Hi" and events[-1]["index"] == 3


def test_tokenize_byte_offsets(http):
    r = http.post("/tokenize", json={"inputs": "hé!", "parameters": {"truncate": 1}})
    assert r.status_code == 200
    assert r.json() == [
        {"id": BOS, "text": "", "start": 0, "stop": 0},
        {"id": token_id("h"), "text": "h", "start": 0, "stop": 1},
        {"id": token_id("é"), "text": "é", "start": 1, "stop": 3},
        {"id": token_id("!"), "text": "!", "start": 3, "stop": 4},
    ]


def test_keep_alive_comment_on_idle_stream(live):
    live.engine.knobs.first_token_delay = 0.8  # keep-alive period is 0.3 s in this fixture
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
    with httpx.stream("POST", f"{live.url}/generate_stream", json=body, timeout=10) as r:
        raw = b"".join(r.iter_raw())
    assert raw.startswith(b":\n\n:\n\n")
    assert raw.endswith(b'"generated_text":"H","details":null}\n\n')
    assert live.engine.cancelled == []
