"""`python -m tests.server.drain_server PORT GRACE_S TOKEN_DELAY_S`: serve a FakeEngine with
server.lifecycle (real signal handling) for the SIGTERM drain tests; prints a line when the
engine has been shut down."""

from __future__ import annotations

import asyncio
import sys

from server.app import build_app
from server.lifecycle import serve_async
from server.metrics import StepRecorder
from server.settings import Settings
from tests.server.fake_engine import FakeEngine


def main() -> None:
    port, grace, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    engine = FakeEngine()
    engine.knobs.token_delay = delay
    settings = Settings(port=port, graceful_termination_timeout=grace)
    app = build_app(engine, settings, steps=StepRecorder())
    print("serving", flush=True)
    asyncio.run(serve_async(app, settings))
    print(f"engine shutdown calls: {engine.shutdown_calls}", flush=True)


if __name__ == "__main__":
    main()
