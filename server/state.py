"""What every handler needs, built once per app: the engine, the settings and limits, the
validator, the permits, the drain state and the metrics. Handlers reach it with `of(request)`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from importlib import metadata

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from server.admission import Drain, Permits
from server.metrics import RequestMetrics, StepRecorder
from server.settings import Settings
from server.validation import Validator
from tgix.engine.request import EngineLimits


def version() -> str:
    try:
        return metadata.version("tgix")
    except metadata.PackageNotFoundError:
        return "0.1.0"


@dataclass(slots=True, kw_only=True)
class ServerState:
    engine: object
    settings: Settings
    limits: EngineLimits
    validator: Validator
    permits: Permits
    drain: Drain
    metrics: RequestMetrics
    registry: CollectorRegistry
    steps: StepRecorder
    keep_alive_s: float
    model_id: str
    pipeline_tag: str | None
    compute_type: str = field(default_factory=lambda: os.environ.get("COMPUTE_TYPE", ""))
    fingerprint: str = field(default_factory=lambda: f"{version()}-native")

    @property
    def full_text_default(self) -> bool:
        """`/` echoes the prompt unless the model's pipeline tag says otherwise (§2.5)."""
        return self.pipeline_tag in (None, "text-generation")

    def stream_headers(self, inputs_chars: int) -> dict[str, str]:
        return {"x-compute-type": self.compute_type, "x-compute-characters": str(inputs_chars)}


def of(request: Request) -> ServerState:
    return request.app.state.tgix


class Clock:
    """Timestamps of one request, for TGI's x-*-time headers and the duration metrics."""

    __slots__ = ("start", "validated")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.validated = self.start

    def mark_validated(self) -> None:
        self.validated = time.monotonic()

    @property
    def validation_s(self) -> float:
        return self.validated - self.start

    def total_s(self) -> float:
        return time.monotonic() - self.start
