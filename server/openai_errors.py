"""Error bodies on `/v1/*` in the shape the OpenAI SDK parses, with TGI's status codes.

TGI answers every route with `{"error": "<message>", "error_type": "<type>"}` (or plain text
before a handler runs); the OpenAI SDK reads `body["error"]` as an object, so against TGI its
`e.body` is a bare string and `e.code` / `e.type` are empty. On `/v1/*` this middleware
rewrites any error response (status >= 400, not an event stream) to vLLM's shape:

    {"error": {"message": "<TGI's message>", "type": "<TGI's error_type>", "param": null,
               "code": <status>}}

The status code is unchanged (TGI's 422 where OpenAI would say 400), so status-based client
logic sees TGI's codes; TGI's own routes keep TGI's bodies. Errors inside a 200 stream keep
TGI's in-stream shape (`{"error": {"message", "http_status_code"}}`), which the SDK's stream
reader already understands.
"""

from __future__ import annotations

import json
from http import HTTPStatus

PREFIX = "/v1/"
_MAX_ERROR_BODY = 1 << 20  # error bodies are short; a larger one passes through untouched


_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def openai_error(status: int, message: str, error_type: str | None = None) -> dict:
    """The body for one error; without TGI's error_type, OpenAI's type for the status."""
    if error_type is None:
        error_type = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def rewrite(status: int, body: bytes, content_type: str) -> bytes:
    """A TGI error body (JSON `{"error": str, "error_type"}`, plain text, or empty) as the
    OpenAI body; bodies already in that shape are kept."""
    text = body.decode("utf-8", "replace")
    if content_type.startswith("application/json"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("error"), dict):
            return body
        if isinstance(value, dict) and isinstance(value.get("error"), str):
            error_type = value.get("error_type")
            return _dump(openai_error(status, value["error"], error_type))
    return _dump(openai_error(status, text.strip() or _reason(status)))


def _dump(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class OpenAIErrorMiddleware:
    """Plain ASGI (so streams and disconnects pass through): holds an error response's start
    until its body is complete, then sends the rewritten body with a matching length."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        held: dict | None = None
        chunks: list[bytes] = []

        async def send_rewritten(message):
            nonlocal held
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                kind = headers.get(b"content-type", b"").decode("latin-1")
                if message["status"] >= 400 and not kind.startswith("text/event-stream"):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body") and sum(map(len, chunks)) <= _MAX_ERROR_BODY:
                    return
                await _send_error(send, held, b"".join(chunks), message.get("more_body", False))
                held = None
                return
            await send(message)

        await self.app(scope, receive, send_rewritten)


async def _send_error(send, start: dict, body: bytes, more: bool) -> None:
    headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
    if more:  # oversized: pass through as it came
        await send({**start, "headers": [*headers]})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        return
    kind = dict(start.get("headers") or []).get(b"content-type", b"").decode("latin-1")
    out = rewrite(start["status"], body, kind)
    headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": out})
