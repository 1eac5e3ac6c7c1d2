"""TGI's error bodies and status codes (§4), in one place.

Two families: `ApiError` is TGI's own JSON `{"error": ..., "error_type": ...}` (422
validation, 429 overloaded, 424 generation, ...); `PlainError` is what TGI's web framework
(axum) answers before a handler runs: a plain-text body for malformed JSON, wrong field
types, a missing content type or an oversize body. Neither family ever carries a stack trace.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from tgix.engine.request import GenerationError


class ApiError(Exception):
    """A request that ends with TGI's JSON error body."""

    def __init__(self, status: int, message: str, error_type: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}

    def openai_body(self) -> dict:
        """The shape TGI's OpenAI streams use for errors (§2.6; the status is always 422)."""
        return {"error": {"message": self.message, "http_status_code": 422}}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        body = json.dumps(self.body(), ensure_ascii=False, separators=(",", ":"))
        return Response(body, self.status, headers=headers, media_type="application/json")

    @property
    def metric_label(self) -> str:
        """`tgi_request_failure{err=...}` label for this error."""
        return _METRIC_LABELS.get(self.error_type, self.error_type)


class PlainError(Exception):
    """A framework-level rejection: a status and a plain-text body (§2.1)."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text

    def response(self) -> Response:
        return Response(self.text, self.status, media_type="text/plain; charset=utf-8")


_METRIC_LABELS = {
    "incomplete_generation": "incomplete",
    "incomplete_generation_stream": "incomplete",
    "template_error": "template",
    "tool_error": "validation",
}


def validation(detail: str) -> ApiError:
    return ApiError(422, f"Input validation error: {detail}", "validation")


def overloaded() -> ApiError:
    return ApiError(429, "Model is overloaded", "overloaded")


def template(detail: str) -> ApiError:
    return ApiError(422, f"Template error: {detail}", "template_error")


def tool(detail: str) -> ApiError:
    return ApiError(422, f"Tool error: {detail}", "tool_error")


def incomplete(stream: bool) -> ApiError:
    if stream:
        return ApiError(500, "Incomplete generation stream", "incomplete_generation_stream")
    return ApiError(500, "Incomplete generation", "incomplete_generation")


def shutting_down() -> ApiError:
    return ApiError(503, "Request aborted: the server is shutting down", "shutdown")


def unhealthy() -> ApiError:
    return ApiError(503, "unhealthy", "healthcheck")


def from_generation_error(exc: GenerationError) -> ApiError:
    """Map the engine's GenerationError onto TGI's status codes and message prefixes."""
    kind = exc.error_type
    if kind == "validation":
        return validation(exc.message)
    if kind == "overloaded":
        return overloaded()
    if kind == "shutdown":
        return shutting_down()
    return ApiError(424, f"Request failed during generation: {exc.message}", "generation")
