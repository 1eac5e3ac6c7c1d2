"""Images over HTTP on the real engine (tiny random Idefics3 and Qwen2.5-VL, every shape
compiled): OpenAI
`image_url` parts and TGI's `![](url)` markdown give the engine's own answer for the
processor's prompt, streamed and with a grammar too; bad images (truncated, 1x1, a 20000 x
20000 header, a wrong type, an unreachable or silent URL, a private address, too many) are a
422 with TGI's body within the fetch timeout, while other requests run on unaffected."""

from __future__ import annotations

import base64
import concurrent.futures
import http.server as http_server
import io
import json
import re
import socket
import struct
import threading
import time
import zlib

import httpx
import numpy as np
import pytest
from PIL import Image

from server.app import build_app
from server.args import parse_args
from tests.compiles import recording_compiles
from tests.server.conftest import LiveServer
from tests.server.real_engine import SlowSteps, _engine_for
from tgix import testing_qwen_vl, testing_vlm
from tgix.engine.request import Completion, GenerationRequest

ARGV = [
    "--max-input-tokens", "400",
    "--max-total-tokens", "448",
    "--max-batch-prefill-tokens", "512",
    "--max-batch-total-tokens", "2048",
    "--max-batch-size", "4",
    "--image-fetch-timeout", "1",
    "--max-images", "3",
]  # fmt: skip
N = 6


def png(height: int, width: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_uri(body: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(body).decode()}"


def header_bomb() -> bytes:
    """A valid PNG header claiming 20000 x 20000 pixels (a few hundred bytes in all)."""
    body = png(8, 8, 0)
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    patched = struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return body[:8] + patched + body[8 + 25 :]


class Servers:
    def __init__(self, engine, strict: LiveServer, open_: LiveServer):
        self.engine, self.strict, self.open = engine, strict, open_

    def direct(self, text: str, images: list, n: int = N) -> Completion:
        ids, spans = self.engine.vision.prepare(text, images, add_special_tokens=False)
        request = GenerationRequest(prompt_ids=ids, max_new_tokens=n, images=spans)
        *_, final = self.engine.submit(request)
        return final


def _serve(tmp_path_factory, path, name: str, *more_argv: list[str]):
    """The engine on `path` (what tgix.serve builds) behind one app per argv extension."""
    settings = parse_args(ARGV, environ={})
    hook = SlowSteps()
    engine = _engine_for(settings, path, str(tmp_path_factory.mktemp(f"xla-{name}")), hook)
    apps = [build_app(engine, parse_args([*ARGV, *m], environ={}), steps=hook.recorder)
            for m in ([], *more_argv)]  # fmt: skip
    servers = [LiveServer(app, engine) for app in apps]
    return engine, servers


def _stop(engine, servers) -> None:
    for server in servers:
        server.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    path = testing_vlm.write_tiny_idefics3(tmp_path_factory.mktemp("vlm-server"))
    engine, (strict, open_) = _serve(tmp_path_factory, path, "vlm", ["--allow-private-image-urls"])
    yield Servers(engine, strict, open_)
    _stop(engine, (strict, open_))


@pytest.fixture
def http(servers):
    with httpx.Client(base_url=servers.strict.url, timeout=30) as client:
        yield client
    assert_idle(servers)


def assert_idle(servers, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        s = servers.engine.stats()
        permits = servers.strict.state.permits.in_use + servers.open.state.permits.in_use
        if s and s["batch_size"] == 0 and s["used_pages"] == 0 and permits == 0:
            return
        assert time.monotonic() < deadline, f"not idle: {s}"
        time.sleep(0.01)


def chat_body(urls: list[str], text: str = "What is this?", **extra) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content = [*parts, {"type": "text", "text": text}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": N}
    return {**body, "temperature": 0, **extra}


def template_text(servers, count: int, text: str = "What is this?") -> str:
    parts = [{"type": "image"}] * count + [{"type": "text", "text": text}]
    return servers.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True
    )


def images_of(*bodies: bytes) -> list:
    return [Image.open(io.BytesIO(b)).convert("RGB") for b in bodies]


def test_chat_with_image_parts_answers_as_the_engine(servers, http):
    a, b = png(24, 40, 1), png(61, 17, 2)
    r = http.post("/v1/chat/completions", json=chat_body([data_uri(a), data_uri(b)]))
    assert r.status_code == 200, r.text
    body = r.json()
    expected = servers.direct(template_text(servers, 2), images_of(a, b))
    assert body["choices"][0]["message"]["content"] == expected.generated_text
    assert body["usage"]["prompt_tokens"] == expected.input_length


def test_chat_stream_with_an_image(servers, http):
    a = png(40, 40, 3)
    r = http.post("/v1/chat/completions", json=chat_body([data_uri(a)], stream=True))
    assert r.status_code == 200
    frames = [json.loads(f[6:]) for f in r.text.split("\n\n") if f.startswith("data: {")]
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"])
    assert text == servers.direct(template_text(servers, 1), images_of(a)).generated_text


def test_generate_markdown_image_with_a_grammar(servers, http):
    a = png(30, 50, 4)
    inputs = f"![]({data_uri(a)})Describe it:"
    grammar = {"type": "regex", "value": "[ab]{6}"}
    params = {"max_new_tokens": N, "grammar": grammar}
    r = http.post("/generate", json={"inputs": inputs, "parameters": params})
    assert r.status_code == 200, r.text
    assert re.fullmatch("[ab]{6}", r.json()["generated_text"])
    plain = http.post("/generate", json={"inputs": inputs, "parameters": {"max_new_tokens": N}})
    processor_text = f"{servers.engine.vision.image_token}Describe it:"
    ids, spans = servers.engine.vision.prepare(processor_text, images_of(a))
    *_, final = servers.engine.submit(
        GenerationRequest(prompt_ids=ids, max_new_tokens=N, images=spans)
    )
    assert plain.json()["generated_text"] == final.generated_text


class _ImageHandler(http_server.BaseHTTPRequestHandler):
    body = png(32, 48, 5)

    def do_GET(self):
        kind = "text/html" if self.path.endswith(".html") else "image/png"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_loopback_url_with_the_flag_equals_the_data_uri(servers, image_host, http):
    with httpx.Client(base_url=servers.open.url, timeout=30) as client:
        fetched = client.post("/v1/chat/completions", json=chat_body([f"{image_host}/a.png"]))
    inline = http.post("/v1/chat/completions", json=chat_body([data_uri(_ImageHandler.body)]))
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["message"] == inline.json()["choices"][0]["message"]


def _silent_port():
    """A listening socket that never answers (a fetch must give up at its timeout)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


BAD = {
    "truncated PNG": (data_uri(png(40, 40, 6)[:300]), "could not be decoded"),
    "1x1": (data_uri(png(1, 1, 7)), "each side must be at least 8 pixels"),
    "header bomb": (data_uri(header_bomb()), "pixels"),
    "wrong MIME": (data_uri(b"hello", "text/plain"), "data URI type `text/plain` is not an image"),
    "not base64": ("data:image/png;base64,@@@", "not valid base64"),
    "private address": ("http://10.1.2.3/x.png", "is not a public address"),
    "loopback": ("http://127.0.0.1:9/x.png", "is not a public address"),
    "ftp": ("ftp://example.com/x.png", "scheme `ftp` is not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_images_are_a_422(case, http):
    url, why = BAD[case]
    started = time.monotonic()
    r = http.post("/v1/chat/completions", json=chat_body([url]))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["type"] == "validation"
    assert why in r.json()["error"]["message"]
    assert time.monotonic() - started < 2
    g = http.post(
        "/generate", json={"inputs": f"![]({url})hi", "parameters": {"max_new_tokens": 2}}
    )
    assert g.status_code == 422 and g.json()["error_type"] == "validation"
    assert why in g.json()["error"]


def test_unreachable_wrong_type_and_too_many(servers, image_host):
    with httpx.Client(base_url=servers.open.url, timeout=30) as client:
        refused = client.post(
            "/v1/chat/completions", json=chat_body([f"http://127.0.0.1:{_closed_port()}/x.png"])
        )
        html = client.post("/v1/chat/completions", json=chat_body([f"{image_host}/page.html"]))
        many = client.post("/v1/chat/completions", json=chat_body([data_uri(png(16, 16, 9))] * 4))
    assert (
        refused.status_code == 422 and "could not be fetched" in refused.json()["error"]["message"]
    )
    assert (
        html.status_code == 422 and "`text/html`, not an image" in html.json()["error"]["message"]
    )
    assert many.status_code == 422
    assert many.json()["error"]["message"].endswith("at most 3 images per request. Given: 4")
    assert_idle(servers)


def test_a_silent_url_times_out_while_other_requests_run(servers, http):
    silent = _silent_port()
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/x.png"
    try:
        with httpx.Client(base_url=servers.open.url, timeout=30) as client, \
                concurrent.futures.ThreadPoolExecutor(4) as pool:  # fmt: skip
            started = time.monotonic()
            slow = [pool.submit(client.post, "/v1/chat/completions", json=chat_body([url]))
                    for _ in range(3)]  # fmt: skip
            time.sleep(0.1)
            plain = http.post(
                "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}}
            )
            plain_done = time.monotonic() - started
            answers = [f.result() for f in slow]
            slow_done = time.monotonic() - started
    finally:
        silent.close()
    assert plain.status_code == 200 and plain_done < 1.0
    for answer in answers:
        assert answer.status_code == 422
        assert "could not be fetched" in answer.json()["error"]["message"]
    assert 0.9 < slow_done < 2.5  # the 1 s fetch timeout, not a hang


def test_image_traffic_compiles_nothing(servers, http):
    with recording_compiles() as compiles, concurrent.futures.ThreadPoolExecutor(3) as pool:
        urls = [data_uri(png(20 + 9 * i, 60 - 7 * i, 20 + i)) for i in range(3)]
        chats = [pool.submit(http.post, "/v1/chat/completions", json=chat_body(urls[: i + 1]))
                 for i in range(3)]  # fmt: skip
        text = http.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}})
        answers = [c.result() for c in chats]
    assert text.status_code == 200 and all(a.status_code == 200 for a in answers)
    assert compiles == []
    metrics = httpx.get(f"{servers.strict.url}/metrics").text
    images = re.search(r"^tgix_images (\S+)$", metrics, re.M)
    assert images and float(images.group(1)) >= 6


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = testing_qwen_vl.write_tiny_qwen25_vl(tmp_path_factory.mktemp("qwen-server"))
    engine, (server,) = _serve(tmp_path_factory, path, "qwen")
    yield Servers(engine, server, server)
    _stop(engine, (server,))


def test_qwen_chat_and_markdown_answer_as_the_engine(qwen):
    a, b = png(24, 40, 31), png(61, 17, 32)
    with httpx.Client(base_url=qwen.strict.url, timeout=30) as client:
        chat = client.post("/v1/chat/completions", json=chat_body([data_uri(a), data_uri(b)]))
        inputs = f"Look: ![]({data_uri(a)}) and this"
        plain = client.post(
            "/generate", json={"inputs": inputs, "parameters": {"max_new_tokens": N}}
        )
    assert chat.status_code == 200, chat.text
    expected = qwen.direct(template_text(qwen, 2), images_of(a, b))
    assert chat.json()["choices"][0]["message"]["content"] == expected.generated_text
    vision = qwen.engine.vision
    ids, spans = vision.prepare(f"Look: {vision.image_token} and this", images_of(a))
    assert spans.rope_delta < 0  # the positions after the image run behind the index
    *_, final = qwen.engine.submit(
        GenerationRequest(prompt_ids=ids, max_new_tokens=N, images=spans)
    )
    assert plain.status_code == 200 and plain.json()["generated_text"] == final.generated_text
    assert_idle(qwen)
