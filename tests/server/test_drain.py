"""SIGTERM drain with the real lifecycle in a child process: in-flight streams finish within
--graceful-termination-timeout, the rest end with an error event at the deadline, new
connections are refused, the engine is shut down and the process exits 0."""

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


def test_sigterm_lets_short_streams_finish(server_factory):
    proc, port = server_factory(grace_s=10, token_delay=0.05)
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 6}}
    stream = RawRequest(port, "/generate_stream", body)
    stream.read_until(b"data: ")
    proc.send_signal(signal.SIGTERM)
    raw = stream.read_all()
    assert b'"generated_text":"Hello"' in raw and b'"error"' not in raw
    with pytest.raises(OSError):  # no longer accepting
        time.sleep(0.3)
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
