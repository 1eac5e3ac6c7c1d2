"""The HTTP server over the REAL engine (tiny random llama, compiled once per session:
tests/server/real_engine.py) on a real uvicorn server on 127.0.0.1: exact greedy ids
against `engine.submit`, byte-level SSE, the unmodified TGI / huggingface_hub / openai
clients, stops, seeded sampling, a disconnect storm that leaves nothing queued, running or
paged, 429 and 422, /health and /info."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import time

import pytest

from server.app import build_app
from server.args import parse_args
from tests.server.conftest import LiveServer
from tests.server.rawhttp import RawRequest
from tests.server.real_engine import ARGV, MESSAGES, PROMPT, N, client_for, idle_around
from tgix.engine.request import Completion, SamplingParams

# text-generation uses pydantic v1 APIs
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def live(real_engine):
    yield from idle_around(real_engine)


@pytest.fixture
def http(live):
    yield from client_for(live)


def _token_dicts(c: Completion) -> list[dict]:
    return [{"id": t.id, "text": t.text, "special": t.special} for t in c.tokens]


def _sse_frames(raw: bytes) -> list[dict]:
    """Every frame is `data: <json>\\n\\n`; nothing else (no keep-alive at this speed)."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    frames = raw[:-2].split(b"\n\n")
    for frame in frames:
        assert frame.startswith(b"data: ") and b"\n" not in frame, frame
    return [json.loads(frame[len(b"data: ") :]) for frame in frames]


def _plain_stop(c: Completion) -> tuple[str, int]:
    """A stop string from the free greedy text: the first printable-ASCII token text (longest
    first) that does not occur earlier in the text, and the index of that token."""
    for shortest in (2, 1):
        text = ""
        for k, t in enumerate(c.tokens):
            plain = len(t.text) >= shortest and re.fullmatch(r"[ -~]+", t.text)
            if k >= 1 and plain and t.text not in text:
                return t.text, k
            text += t.text
    pytest.skip(f"no plain stop candidate in {c.generated_text!r}")


# --- /health, /info ----------------------------------------------------------------------------


def test_health_and_info_report_the_effective_limits(live, http):
    r = http.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert live.engine.healthy()
    info = http.get("/info").json()
    limits = live.engine.limits
    assert (limits.max_input_tokens, limits.max_total_tokens) == (40, 64)
    assert info["max_input_tokens"] == limits.max_input_tokens
    assert info["max_total_tokens"] == limits.max_total_tokens
    assert info["max_concurrent_requests"] == 32
    assert info["model_id"] == live.engine.model_id
    assert info["router"] == "text-generation-router"
    # TGI 3.x's /info has no batch limits; the KV budget is the tgi_batch_max_total_tokens gauge
    assert live.metrics()["tgi_batch_max_total_tokens"] == limits.max_batch_total_tokens == 1024
    assert http.get("/v1/models").json()["data"][0]["id"] == live.engine.model_id


# --- /generate and /generate_stream against engine.submit ------------------------------------


def test_generate_greedy_equals_the_engine(live, http):
    direct = live.direct(PROMPT)
    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": N, "details": True, "decoder_input_details": True},
    }
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    details = out["details"]
    assert out["generated_text"] == direct.generated_text
    assert [{k: t[k] for k in ("id", "text", "special")} for t in details["tokens"]] == (
        _token_dicts(direct)
    )
    assert [t["logprob"] for t in details["tokens"]] == pytest.approx(
        [t.logprob for t in direct.tokens], rel=1e-5, abs=1e-6
    )
    assert details["finish_reason"] == direct.finish_reason
    assert details["generated_tokens"] == direct.generated_tokens
    prompt_ids = live.tokenizer.encode(PROMPT)  # --enable-prefill-logprobs is on here
    assert [t["id"] for t in details["prefill"]] == prompt_ids
    assert details["prefill"][0]["logprob"] is None
    assert all(t["logprob"] < 0 for t in details["prefill"][1:])
    assert details["seed"] is None
    assert "top_tokens" not in details and "best_of_sequences" not in details
    assert r.headers["x-generated-tokens"] == str(direct.generated_tokens)
    assert r.headers["x-prompt-tokens"] == str(len(live.tokenizer.encode(PROMPT)))


def test_generate_stream_sse_frames(live, http):
    direct = live.direct(PROMPT)
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N}}
    with http.stream("POST", "/generate_stream", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
    frames = _sse_frames(raw)
    assert [f["index"] for f in frames] == list(range(1, len(frames) + 1))
    assert [f["token"]["id"] for f in frames] == [t.id for t in direct.tokens]
    assert all(list(f) == ["index", "token", "generated_text", "details"] for f in frames)
    assert all(f["generated_text"] is None and f["details"] is None for f in frames[:-1])
    last = frames[-1]
    assert last["details"] is None
    assert not any(f["token"]["special"] for f in frames)
    assert last["generated_text"] == "".join(f["token"]["text"] for f in frames)
    assert last["generated_text"] == direct.generated_text

    body["parameters"]["details"] = True
    with http.stream("POST", "/generate_stream", json=body) as r:
        frames = _sse_frames(r.read())
    assert frames[-1]["details"] == {
        "finish_reason": direct.finish_reason,
        "generated_tokens": direct.generated_tokens,
        "seed": None,
        "input_length": len(live.tokenizer.encode(PROMPT)),
    }


# --- the real clients, unmodified --------------------------------------------------------------


def test_text_generation_client(live):
    from text_generation import AsyncClient, Client

    direct = live.direct(PROMPT)
    client = Client(live.url, timeout=30)
    response = client.generate(PROMPT, max_new_tokens=N)
    assert response.generated_text == direct.generated_text
    assert [t.id for t in response.details.tokens] == [t.id for t in direct.tokens]
    assert response.details.finish_reason == direct.finish_reason

    responses = list(client.generate_stream(PROMPT, max_new_tokens=N))
    assert [r.token.id for r in responses] == [t.id for t in direct.tokens]
    assert responses[-1].generated_text == direct.generated_text

    async def run():
        client = AsyncClient(live.url, timeout=30)
        response = await client.generate(PROMPT, max_new_tokens=N)
        streamed = [r async for r in client.generate_stream(PROMPT, max_new_tokens=N)]
        return response, streamed

    response, streamed = asyncio.run(run())
    assert response.generated_text == direct.generated_text
    assert streamed[-1].generated_text == direct.generated_text


def test_huggingface_hub_text_generation(live):
    from huggingface_hub import InferenceClient

    direct = live.direct(PROMPT)
    client = InferenceClient(base_url=live.url, timeout=30)
    out = client.text_generation(PROMPT, max_new_tokens=N, details=True, return_full_text=False)
    assert out.generated_text == direct.generated_text
    assert [t.id for t in out.details.tokens] == [t.id for t in direct.tokens]
    assert out.details.finish_reason == direct.finish_reason
    assert client.text_generation(PROMPT, max_new_tokens=N) == PROMPT + direct.generated_text

    chunks = list(client.text_generation(PROMPT, max_new_tokens=N, stream=True, details=True))
    assert [c.token.id for c in chunks] == [t.id for t in direct.tokens]
    # `/` defaults return_full_text to true (pipeline text-generation): TGI's final stream
    # event then carries the prompt too
    assert chunks[-1].generated_text == PROMPT + direct.generated_text


def test_huggingface_hub_chat_completion(live):
    from huggingface_hub import InferenceClient

    prompt = live.chat_prompt()
    # the chat route tokenizes without special tokens; this tokenizer adds none anyway
    assert live.tokenizer.encode(prompt, add_special_tokens=False) == live.tokenizer.encode(prompt)
    direct = live.direct(prompt)
    client = InferenceClient(base_url=live.url, timeout=30)
    out = client.chat_completion(MESSAGES, max_tokens=N, temperature=0)
    assert out.choices[0].message.content == direct.generated_text
    assert out.usage.completion_tokens == direct.generated_tokens
    assert out.usage.prompt_tokens == len(live.tokenizer.encode(prompt))
    chunks = list(client.chat_completion(MESSAGES, max_tokens=N, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == direct.generated_text


def test_openai_sdk_chat_and_completions(live):
    import openai

    chat_direct = live.direct(live.chat_prompt())
    direct = live.direct(PROMPT)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=30)

    chat = client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, temperature=0
    )
    assert chat.choices[0].message.content == chat_direct.generated_text
    assert chat.usage.completion_tokens == chat_direct.generated_tokens
    stream = client.chat.completions.create(
        model="tgi",
        messages=MESSAGES,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_direct.generated_text
    assert chunks[-1].usage.completion_tokens == chat_direct.generated_tokens

    completion = client.completions.create(model="tgi", prompt=PROMPT, max_tokens=N, temperature=0)
    assert completion.choices[0].text == direct.generated_text
    several = client.completions.create(
        model="tgi", prompt=[PROMPT, PROMPT], max_tokens=N, temperature=0
    )
    assert [c.text for c in several.choices] == [direct.generated_text] * 2
    streamed = client.completions.create(
        model="tgi", prompt=PROMPT, max_tokens=N, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == direct.generated_text


# --- stops and seeds ---------------------------------------------------------------------------


def test_stop_sequence_tgi_keeps_it_openai_cuts_it(live, http):
    prompt = live.chat_prompt()
    free = live.direct(prompt)
    stop, k = _plain_stop(free)
    expected = "".join(t.text for t in free.tokens[: k + 1])

    body = {"inputs": prompt, "parameters": {"max_new_tokens": N, "stop": [stop], "details": True}}
    out = http.post("/generate", json=body).json()
    assert out["details"]["finish_reason"] == "stop_sequence"
    assert out["generated_text"].endswith(stop) and out["generated_text"] == expected
    assert out["details"]["generated_tokens"] == k + 1

    import openai

    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=30)
    chat = client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, temperature=0, stop=[stop]
    )
    assert chat.choices[0].finish_reason == "stop"
    assert chat.choices[0].message.content == expected[: -len(stop)]
    assert stop not in chat.choices[0].message.content
    stream = client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, temperature=0, stop=[stop], stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected[: -len(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(live, http):
    params = {"max_new_tokens": N, "do_sample": True, "seed": 1234, "details": True}
    a, b = (http.post("/generate", json={"inputs": PROMPT, "parameters": params}) for _ in "ab")
    a, b = a.json(), b.json()
    assert a == b  # every token, logprob and the text
    assert a["details"]["seed"] == 1234
    sampled = live.direct(PROMPT, sampling=SamplingParams(do_sample=True, seed=1234))
    assert a["generated_text"] == sampled.generated_text and sampled.seed == 1234
    assert [t["id"] for t in a["details"]["tokens"]] == [t.id for t in sampled.tokens]
    # no seed: the engine picks one, reports it, and it reproduces the answer
    c = http.post("/generate", json={"inputs": PROMPT, "parameters": {**params, "seed": None}})
    picked = c.json()["details"]["seed"]
    assert isinstance(picked, int)
    again = http.post(
        "/generate", json={"inputs": PROMPT, "parameters": {**params, "seed": picked}}
    )
    assert again.json()["generated_text"] == c.json()["generated_text"]


# --- disconnects, overload, validation ---------------------------------------------------------


def test_disconnect_storm_leaves_nothing_and_the_answer_stays(live, http):
    greedy = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "details": True}}
    baseline = http.post("/generate", json=greedy).json()
    before = live.metrics()
    steps_before = live.engine.stats()["steps"]
    live.hook.delay = 0.02  # ~50 tokens each: >= 4 s for 16 requests in batches of 4
    long = {"max_new_tokens": 60}

    def request(i: int) -> RawRequest:
        if i % 2:
            return RawRequest(live.port, "/generate_stream", {"inputs": "Hi", "parameters": long})
        body = {"messages": MESSAGES, "stream": True, "temperature": 0, "max_tokens": 40}
        return RawRequest(live.port, "/v1/chat/completions", body)

    def hang_up_after_three_events(req: RawRequest) -> None:
        try:
            head = req.read_until(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            deadline = time.monotonic() + 10
            while req.buffer.count(b"data: ") < 3:
                assert time.monotonic() < deadline, req.buffer
                chunk = req.sock.recv(65536)
                assert chunk, req.buffer
                req.buffer += chunk
        finally:
            req.hang_up()

    start = time.monotonic()
    streams = [request(i) for i in range(20)]
    deadline = time.monotonic() + 5
    while (s := live.engine.stats())["queue_size"] + s["batch_size"] < 20:  # all submitted
        assert time.monotonic() < deadline, s
        time.sleep(0.005)
    assert s["batch_size"] <= 4 and s["queue_size"] >= 16
    streams, queued = streams[:16], streams[16:]
    for req in queued:  # opened last: almost surely still queued, never streamed
        req.hang_up()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(hang_up_after_three_events, streams))
    stats = live.idle(timeout=5.0)
    elapsed = time.monotonic() - start
    live.hook.delay = 0.0

    # cancelled, not finished: far fewer steps than 16 x ~50 tokens in batches of 4 would take
    assert stats["steps"] - steps_before < 100, (stats, steps_before, elapsed)
    after = live.metrics()
    assert after["tgi_queue_size"] == 0 and after["tgi_batch_current_size"] == 0
    assert after["tgi_batch_current_max_tokens"] == 0
    assert after["tgi_request_success"] == before["tgi_request_success"]
    dropped = 'tgi_request_failure{err="dropped"}'
    assert after.get(dropped, 0) - before.get(dropped, 0) == 20
    assert stats["free_pages"] + stats["cached_pages"] == live.engine.runner.config.num_pages - 1
    assert http.post("/generate", json=greedy).json() == baseline
    # the KV pages by state and the prefix cache's counters, as gauges: none held once idle
    engine_stats = live.idle(timeout=5.0)
    pages = live.metrics()
    assert pages["tgix_kv_used_pages"] == 0 and pages["tgix_prefix_cache_shared_pages"] == 0
    assert pages["tgix_kv_free_pages"] + pages["tgix_prefix_cache_cached_pages"] == (
        live.engine.runner.config.num_pages - 1
    )
    assert pages["tgix_prefix_cache_hit_tokens"] == engine_stats["prefix_hit_tokens"] > 0
    assert pages["tgix_prefix_cache_lookup_tokens"] == engine_stats["prefix_lookup_tokens"]
    assert 0 < pages["tgix_prefix_cache_hit_rate"] <= 1


def test_429_under_overload_with_the_real_engine(live):
    from text_generation import Client
    from text_generation.errors import OverloadedError

    settings = parse_args([*ARGV, "--max-concurrent-requests", "2"], environ={})
    app = build_app(live.engine, settings, steps=live.hook.recorder)
    server = LiveServer(app, live.engine)
    held: list[RawRequest] = []
    try:
        live.hook.delay = 0.02
        slow = {"inputs": "Hi", "parameters": {"max_new_tokens": 50}}
        held = [RawRequest(server.port, "/generate_stream", slow) for _ in range(2)]
        for req in held:
            req.read_until(b"data: ")
        assert server.state.permits.available == 0
        for path, body in [
            ("/generate_stream", slow),
            ("/generate", slow),
            ("/v1/chat/completions", {"messages": MESSAGES, "stream": True}),
        ]:
            raw = RawRequest(server.port, path, body).read_all()
            head, _, payload = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429 "), (path, raw)
            if path.startswith("/v1/"):  # the OpenAI SDK's shape, TGI's status
                assert json.loads(payload) == {
                    "error": {
                        "message": "Model is overloaded",
                        "type": "overloaded",
                        "param": None,
                        "code": 429,
                    }
                }
            else:
                assert payload == b'{"error":"Model is overloaded","error_type":"overloaded"}'
        with pytest.raises(OverloadedError, match="Model is overloaded"):
            Client(server.url, timeout=10).generate("Hi", max_new_tokens=2)
    finally:
        for req in held:
            req.hang_up()
        live.hook.delay = 0.0
        deadline = time.monotonic() + 5
        while server.state.permits.in_use and time.monotonic() < deadline:
            time.sleep(0.01)
        server.stop()
    assert server.state.permits.in_use == 0


def test_422_for_a_prompt_over_max_input_tokens(live, http):
    text = "the"
    while len(live.tokenizer.encode(text)) <= 40:
        text += " the"
    n = len(live.tokenizer.encode(text))
    assert 40 < n <= 62, n  # over max_input_tokens, within max_total_tokens with 2 new tokens
    r = http.post("/generate", json={"inputs": text, "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 422
    assert r.json() == {
        "error": f"Input validation error: `inputs` must have less than 40 tokens. Given: {n}",
        "error_type": "validation",
    }
    budget = http.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 60}})
    n_prompt = len(live.tokenizer.encode(PROMPT))
    assert budget.status_code == 422
    assert budget.json()["error"] == (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 64. "
        f"Given: {n_prompt} `inputs` tokens and 60 `max_new_tokens`"
    )
