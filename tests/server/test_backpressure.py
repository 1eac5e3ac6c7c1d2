"""Backpressure and disconnects on a real uvicorn server: 429 at once (before any SSE byte),
a client that hangs up is cancelled in the engine and its permit returned, for streams and
non-streaming calls, queued or running; a disconnect storm leaves nothing behind."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests.server.rawhttp import RawRequest, wait_for

SLOW = {"inputs": "Hello world", "parameters": {"max_new_tokens": 11}}


def _overload(live) -> list[RawRequest]:
    """Fill all 8 permits with slow streams that are already running."""
    live.engine.knobs.token_delay = 0.05
    held = [RawRequest(live.port, "/generate_stream", SLOW) for _ in range(8)]
    for request in held:
        request.read_until(b"data: ")
    assert live.state.permits.available == 0
    return held


def test_429_at_once_before_any_sse_byte(live):
    held = _overload(live)
    try:
        start = time.monotonic()
        for path, body in [
            ("/generate_stream", SLOW),
            ("/", {**SLOW, "stream": True}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "stream": True},
            ),
            ("/v1/completions", {"prompt": "x", "stream": True}),
            ("/generate", SLOW),
        ]:
            raw = RawRequest(live.port, path, body).read_all()
            head, _, payload = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429 "), (path, raw)
            assert b"content-type: application/json" in head.lower()
            if path.startswith("/v1/"):  # the OpenAI SDK's shape, TGI's status
                assert payload == (
                    b'{"error":{"message":"Model is overloaded","type":"overloaded",'
                    b'"param":null,"code":429}}'
                )
            else:
                assert payload == b'{"error":"Model is overloaded","error_type":"overloaded"}'
        assert time.monotonic() - start < 1.0  # refused at once, not queued
    finally:
        for request in held:
            request.hang_up()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text-generation uses pydantic v1 APIs
def test_overload_with_the_python_clients(live):
    from text_generation import Client
    from text_generation.errors import OverloadedError

    held = _overload(live)
    try:
        client = Client(live.url, timeout=5)
        for call in (client.generate, lambda p: list(client.generate_stream(p))):
            try:
                call("Hi")
            except OverloadedError as exc:
                assert "Model is overloaded" in str(exc)
            else:
                raise AssertionError("no OverloadedError")
    finally:
        for request in held:
            request.hang_up()


def test_stream_disconnect_cancels_and_releases(live):
    live.engine.knobs.token_delay = 0.05
    request = RawRequest(live.port, "/generate_stream", SLOW)
    request.read_until(b'"index":2')
    request.hang_up()
    wait_for(lambda: live.engine.cancelled, what="engine cancel")
    live.wait_idle()
    assert live.engine.finished == []


def test_non_stream_disconnect_while_running_and_while_queued(live):
    live.engine.knobs.token_delay = 0.05
    request = RawRequest(live.port, "/generate", SLOW)
    wait_for(lambda: live.engine.active, what="request running")
    request.hang_up()
    wait_for(lambda: len(live.engine.cancelled) == 1, what="cancel of running request")
    live.wait_idle()

    live.engine.knobs.first_token_delay = 2.0  # waiting for its first step
    for path, body in [
        ("/generate", SLOW),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ]:
        request = RawRequest(live.port, path, body)
        wait_for(lambda: live.engine.active, what="request queued")
        request.close()
        wait_for(lambda: not live.engine.active, what="cancel of queued request")
    assert len(live.engine.cancelled) == 3 and live.engine.finished == []


def test_openai_stream_disconnect(live):
    live.engine.knobs.token_delay = 0.05
    body = {"prompt": ["aaaaaaaaaa", "bbbbbbbbbb"], "stream": True, "max_tokens": 10}
    request = RawRequest(live.port, "/v1/completions", body)
    request.read_until(b"data: ")
    request.hang_up()
    wait_for(lambda: len(live.engine.cancelled) == 2, what="both prompts cancelled")
    live.wait_idle()


def test_disconnect_storm_leaves_nothing_and_answers_stay_the_same(live, http):
    baseline = http.post("/generate", json=SLOW).json()
    live.engine.knobs.token_delay = 0.02

    def hang_up_after_one_event(i: int) -> bool:
        path = "/generate_stream" if i % 2 else "/v1/chat/completions"
        body = SLOW if i % 2 else {"messages": [{"role": "user", "content": "x"}], "stream": True}
        request = RawRequest(live.port, path, body)
        try:
            if not request.read_until(b"\r\n\r\n").startswith(b"HTTP/1.1 200"):
                return False  # 429: permits of hung-up streams are not back yet
            request.read_until(b"data: ")
            return True
        finally:
            request.hang_up()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streamed = sum(pool.map(hang_up_after_one_event, range(40)))
    live.wait_idle()
    assert streamed >= 20 and len(live.engine.cancelled) == len(live.engine.submitted) - 1
    metrics = httpx.get(f"{live.url}/metrics").text.splitlines()
    assert "tgi_batch_current_size 0.0" in metrics and "tgi_queue_size 0.0" in metrics
    live.engine.knobs.token_delay = 0.0
    assert http.post("/generate", json=SLOW).json() == baseline


def test_permits_are_released_after_every_kind_of_ending(live, http):
    http.post("/generate", json={"inputs": "", "parameters": {}})  # validation error
    http.post("/generate_stream", json={"inputs": "Hi", "parameters": {"top_k": 0}})
    live.engine.knobs.fail_after = 0
    http.post("/generate", json=SLOW)  # generation error
    http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    assert live.state.permits.available == live.state.permits.total


def test_tokenize_routes_take_a_permit(live):
    """A flood of tokenizations queues behind the same permits as generations (429 once
    they are gone), so it cannot crowd out /health or the validation pool unbounded."""
    held = _overload(live)
    try:
        for path, body in (
            ("/tokenize", {"inputs": "Hi"}),
            ("/chat_tokenize", {"messages": [{"role": "user", "content": "Hi"}]}),
        ):
            r = httpx.post(f"{live.url}{path}", json=body, timeout=10)
            assert r.status_code == 429, path
        assert httpx.get(f"{live.url}/health", timeout=1).status_code == 200
    finally:
        for request in held:
            request.hang_up()
    live.wait_idle()
    assert httpx.post(f"{live.url}/tokenize", json={"inputs": "Hi"}, timeout=10).status_code == 200
    assert live.state.permits.in_use == 0
