"""Connections over a real uvicorn server (the fake engine): slow request heads and bodies
are cut at fixed deadlines (slowloris), a head with both Content-Length and
Transfer-Encoding is refused (request smuggling), an oversized body's 413 reaches a client
that sends it all before reading, and open connections are capped below the file limit."""

from __future__ import annotations

import logging
import resource
import socket
import time

import pytest

from server import jsonio, protocol
from server.app import build_app
from server.metrics import StepRecorder
from tests.server.conftest import LiveServer, make_settings
from tests.server.fake_engine import FakeEngine

BODY = b'{"inputs":"Hi","parameters":{"max_new_tokens":2}}'


class QuickHeads(protocol.GuardedH11Protocol):
    head_timeout_s = 0.6


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine()
    app = build_app(engine, make_settings(payload_limit=1000), steps=StepRecorder())
    live = LiveServer(app, engine, http=QuickHeads)
    yield live
    live.stop()


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and a Content-Length body) off a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _head(length: int, extra: str = "") -> bytes:
    return (
        "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def test_a_trickled_head_is_cut_at_a_fixed_deadline(server):
    sock, start = _connect(server), time.monotonic()
    head = _head(len(BODY))
    try:
        for i in range(len(head)):  # one byte every 0.1 s: each resets uvicorn's own timer
            sock.sendall(head[i : i + 1])
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer.lower()
    assert time.monotonic() - start < 3.0
    idle = _connect(server)  # a connection that says nothing is closed too, silently
    assert _read_all(idle) == b""


def test_a_head_within_the_deadline_is_served_and_the_deadline_rearms(server):
    sock = _connect(server)
    for _ in range(3):  # keep-alive: each request's head gets its own deadline
        sock.sendall(_head(len(BODY)) + BODY)
        answer = _response(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'"Hi"}'), answer
        time.sleep(0.3)
    sock.close()


def test_content_length_with_transfer_encoding_is_refused(server):
    server.engine.reset()
    sock = _connect(server)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    sock.sendall(_head(len(BODY), "Transfer-Encoding: chunked\r\n") + chunked)
    answer = _read_all(sock)  # and the connection is closed after the answer
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"Both Content-Length and Transfer-Encoding" in answer
    assert server.engine.submitted == []


@pytest.mark.parametrize("announced", [True, False])
def test_the_413_reaches_a_client_that_sends_everything_first(server, announced):
    big = b'{"inputs":"' + b"x" * 200_000 + b'"}'
    sock = _connect(server)
    if announced:
        sock.sendall(_head(len(big)) + big)
    else:
        head = b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        chunked = b"".join(
            b"%x\r\n%s\r\n" % (4096, big[i : i + 4096]) for i in range(0, 196608, 4096)
        )
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n")
    answer = _response(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:100]
    sock.close()


def test_a_slow_body_is_a_408(server, monkeypatch):
    monkeypatch.setattr(jsonio, "BODY_TIMEOUT_S", 0.5)
    sock = _connect(server)
    sock.sendall(_head(len(BODY)) + BODY[:10])  # and the rest never comes
    answer = _response(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"Timed out reading the request body" in answer
    sock.close()


def test_connections_are_capped_below_the_file_limit(monkeypatch, caplog):
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 4096))
    with caplog.at_level(logging.WARNING, logger="tgix.server"):
        assert protocol.connection_cap(4096) == 1024 - protocol.FD_RESERVE
    assert "open connections capped at 960 (file limit 1024)" in caplog.text
    assert protocol.connection_cap(100) == 100


def test_connections_past_the_cap_get_a_503(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda what: (protocol.FD_RESERVE + 2, 4096))
    engine = FakeEngine()
    app = build_app(engine, make_settings(), steps=StepRecorder())
    live = LiveServer(app, engine, limit_concurrency=protocol.connection_cap(4096))
    held = [_connect(live) for _ in range(2)]
    try:
        extra = _connect(live)
        extra.sendall(_head(len(BODY)) + BODY)
        answer = _read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert engine.submitted == []
    finally:
        for sock in held:
            sock.close()
        live.stop()
