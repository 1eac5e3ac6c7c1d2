"""SIGTERM drain with the real lifecycle in a child process: in-flight streams finish within
--graceful-termination-timeout while new requests (and kept-alive connections) get TGI's 503
with `Connection: close`, the rest end with an error event at the deadline, the listener
closes once nothing is in flight, the engine is shut down and the process exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.rawhttp import RawRequest, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(grace_s: int, token_delay: float) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.server.drain_server",
            str(port),
            str(grace_s),
            str(token_delay),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_for(up, timeout=20, what="drain server start")
    return proc, port


@pytest.fixture
def server_factory():
    procs = []

    def start(grace_s: int, token_delay: float):
        proc, port = _start(grace_s, token_delay)
        procs.append(proc)
        return proc, port

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _keep_alive_request(sock: socket.socket) -> bytes:
    body = b'{"inputs":"Hi","parameters":{"max_new_tokens":1}}'
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    data = b""
    while not data.endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_sigterm_lets_short_streams_finish(server_factory):
    proc, port = server_factory(grace_s=10, token_delay=0.1)
    kept = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert _keep_alive_request(kept).startswith(b"HTTP/1.1 200 ")  # an idle keep-alive
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 6}}
    stream = RawRequest(port, "/generate_stream", body)
    stream.read_until(b"data: ")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # while the stream runs: new requests get TGI's 503, not a refused connection, and the
    # kept-alive connection is told to close rather than dropped
    fresh = RawRequest(port, "/generate", {"inputs": "Hi"}).read_all()
    assert fresh.startswith(b"HTTP/1.1 503 ") and fresh.endswith(
        b'{"error":"Request aborted: the server is shutting down","error_type":"shutdown"}'
    )
    again = _keep_alive_request(kept)
    assert again.startswith(b"HTTP/1.1 503 ") and b"connection: close" in again.lower()
    raw = stream.read_all()
    assert b'"generated_text":"Hello"' in raw and b'"error"' not in raw
    time.sleep(0.5)
    with pytest.raises(OSError):  # nothing in flight: the listener is closed
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert "engine shutdown calls: 1" in out


def test_sigterm_deadline_ends_long_requests_with_an_error(server_factory):
    proc, port = server_factory(grace_s=1, token_delay=0.2)
    long = {"inputs": "x" * 100, "parameters": {"max_new_tokens": 100}}
    stream = RawRequest(port, "/generate_stream", long)
    chat = RawRequest(
        port,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 50}], "stream": True},
    )
    waiting = RawRequest(port, "/generate", long)
    stream.read_until(b"data: ")
    chat.read_until(b"data: ")
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    raw = stream.read_all()
    aborted = b"Request aborted: the server is shutting down"
    assert raw.endswith(
        b'data: {"error":"' + aborted + b'","error_type":"shutdown"}\n\n\r\n0\r\n\r\n'
    )
    chat_raw = chat.read_all()
    assert b'{"error":{"message":"' + aborted + b'","http_status_code":422}}' in chat_raw
    assert chat_raw.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert waiting.read_all().startswith(b"HTTP/1.1 503 ")
    out, _ = proc.communicate(timeout=15)
    assert time.monotonic() - start < 8
    assert proc.returncode == 0, out
    assert "engine shutdown calls: 1" in out
