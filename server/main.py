"""The launcher's entry point: `main(argv, engine_factory)`.

Parses TGI's flags, builds the engine with the factory (which loads the model, sizes the
limits from memory and compiles; it may print its own progress), checks the effective
limits as TGI's router does after warm-up, prints one line with those limits, and serves
until SIGTERM. Returns the process exit status (0 after a graceful shutdown, 1 for a refused
argument, 2 for a malformed command line).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
from collections.abc import Callable, Sequence

from server.app import build_app
from server.args import parse_args
from server.heap import release_freed_heap
from server.lifecycle import serve
from server.settings import ArgumentError, Settings

log = logging.getLogger("tgix.server")

EngineFactory = Callable[[Settings], object]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": self.formatTime(record),
            "level": record.levelname,
            "target": record.name,
            "message": record.getMessage(),
        }
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(json_output: bool) -> None:
    """LOG_LEVEL (default info) on stderr; one JSON object per line with --json-output."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(_JsonFormatter() if json_output else logging.Formatter(fmt))
    level = os.environ.get("LOG_LEVEL", "info").split(",")[0].upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler], force=True)


def check_effective_limits(limits) -> None:
    """TGI's router checks on the limits the engine settled on after warm-up (§1.4)."""

    def fail(message: str) -> ArgumentError:
        return ArgumentError(f"Argument validation error: {message}")

    prefill, batch_total = limits.max_batch_prefill_tokens, limits.max_batch_total_tokens
    if limits.max_input_tokens >= limits.max_total_tokens:
        raise fail("`max_input_tokens` must be < `max_total_tokens`")
    if not limits.chunked_prefill and prefill < limits.max_input_tokens:
        raise fail(
            "`max_batch_prefill_tokens` must be >= `max_input_tokens`. "
            f"Given: {prefill} and {limits.max_input_tokens}"
        )
    if prefill > batch_total:
        raise fail(
            "`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {prefill} and {batch_total}"
        )
    if limits.max_total_tokens > batch_total:
        raise fail(
            "`max_total_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {limits.max_total_tokens} and {batch_total}"
        )


def summary(settings: Settings, engine) -> str:
    """The one-line effective-limits summary printed before serving."""
    lim = engine.limits
    return (
        f"tgix serving {engine.model_id} on http://{settings.hostname}:{settings.port}: "
        f"max_input_tokens={lim.max_input_tokens} max_total_tokens={lim.max_total_tokens} "
        f"max_batch_prefill_tokens={lim.max_batch_prefill_tokens} "
        f"max_batch_total_tokens={lim.max_batch_total_tokens} "
        f"max_batch_size={lim.max_batch_size or 'auto'} page_size={lim.page_size} "
        f"chunked_prefill={'on' if lim.chunked_prefill else 'off'} "
        f"max_concurrent_requests={settings.max_concurrent_requests}"
    )


def main(argv: Sequence[str] | None, engine_factory: EngineFactory) -> int:
    try:
        settings = parse_args(argv)
    except SystemExit as exc:  # argparse: --help or a malformed flag
        return exc.code if isinstance(exc.code, int) else 2
    except ArgumentError as exc:
        print(exc, file=sys.stderr)
        return 1
    setup_logging(settings.json_output)
    if settings.env:
        log.info(
            "python %s on %s; settings %s", platform.python_version(), platform.platform(), settings
        )
    log.info("building the engine for %s", settings.model_id or "the default model")
    try:
        engine = engine_factory(settings)
    except ArgumentError as exc:  # the factory's checks on the limits it derived
        print(exc, file=sys.stderr)
        return 1
    if engine is None:  # a follower process of a group: it ran until process 0 stopped
        return 0
    try:
        check_effective_limits(engine.limits)  # type: ignore[attr-defined]
    except ArgumentError as exc:
        engine.shutdown()  # type: ignore[attr-defined]
        print(exc, file=sys.stderr)
        return 1
    app = build_app(engine, settings)
    release_freed_heap()  # what the start-up compiles freed (server/heap.py)
    print(summary(settings, engine), flush=True)
    serve(app, settings)
    return 0
