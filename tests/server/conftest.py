"""Fixtures: a real uvicorn server on 127.0.0.1 (session, in a thread) over a FakeEngine, the
same over the real engine (`real_engine`, session), and in-process apps with custom settings
through Starlette's TestClient."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from server.app import build_app
from server.metrics import StepRecorder
from server.protocol import GuardedH11Protocol
from server.settings import Settings
from tests.server.fake_engine import FakeEngine


class LiveServer:
    def __init__(self, app, engine: FakeEngine, http=None, **config):
        self.app = app
        self.engine = engine
        self.state = app.state.tgix
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            ws="none",
            loop="asyncio",
            http=http or GuardedH11Protocol,  # as server.lifecycle serves
            **config,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Every permit back and no engine request left (what "no leak" means here)."""
        deadline = time.monotonic() + timeout
        while self.state.permits.in_use or self.engine.active:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"leak: {self.state.permits.in_use} permits, engine {self.engine.active}"
                )
            time.sleep(0.01)


def make_settings(**overrides) -> Settings:
    return Settings(**overrides)


@pytest.fixture(scope="session")
def live_server():
    engine = FakeEngine()
    settings = make_settings(max_concurrent_requests=8, max_client_batch_size=3)
    app = build_app(engine, settings, steps=StepRecorder(), keep_alive_s=0.3)
    server = LiveServer(app, engine)
    yield server
    server.stop()


@pytest.fixture
def live(live_server):
    """The session server, with the engine reset before and a leak check after each test."""
    live_server.engine.reset()
    live_server.state.drain.draining = False
    yield live_server
    live_server.wait_idle()


@pytest.fixture
def http(live):
    with httpx.Client(base_url=live.url, timeout=10) as client:
        yield client


@pytest.fixture(scope="session")
def real_engine(tiny_checkpoints, tmp_path_factory):
    """The server over the real engine (tests/server/real_engine.py), started once for every
    module that uses it."""
    from tests.server.real_engine import start

    yield from start(tiny_checkpoints, tmp_path_factory)


@pytest.fixture
def make_client():
    """TestClient over a fresh app: make_client(**settings) -> (client, engine)."""
    clients = []

    def make(engine: FakeEngine | None = None, **overrides):
        engine = engine or FakeEngine()
        app = build_app(engine, make_settings(**overrides), steps=StepRecorder())
        client = TestClient(app, raise_server_exceptions=True)
        clients.append(client)
        return client, engine

    yield make
    for client in clients:
        client.close()
