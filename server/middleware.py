"""ASGI middleware in front of every route: request framing, API-key check, the drain gate.

A request with both `Content-Length` and `Transfer-Encoding` is refused with 400 and
`Connection: close` before anything reads it: a proxy in front may have framed it the other
way (request smuggling, RFC 9112 §6.1).

Authentication is deny-by-default: with --api-key set, every request needs
`Authorization: Bearer <key>` (constant-time compare, key case-sensitive) except the health
probes (GET /health, /ping and /), which orchestrators call without credentials; failures
are 401 with an empty body. While draining after SIGTERM, new requests get 503 and
`Connection: close`. Both are
plain ASGI (not BaseHTTPMiddleware) so streaming and disconnect detection pass through.
"""

from __future__ import annotations

import hmac

from server import errors
from server.admission import Drain

HEALTH_PATHS = frozenset({"/health", "/ping", "/"})


def _is_health(scope) -> bool:
    return scope["method"] in ("GET", "HEAD") and scope["path"] in HEALTH_PATHS


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = api_key.encode("utf-8")

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    token.strip(), self.expected
                )
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _is_health(scope) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})


class DrainMiddleware:
    def __init__(self, app, drain: Drain):
        self.app = app
        self.drain = drain

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.drain.draining and not _is_health(scope):
            response = errors.shutting_down().response(headers={"connection": "close"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class FramingMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            names = {name for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = b"Both Content-Length and Transfer-Encoding: refused"
                headers = [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"connection", b"close"),
                ]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({"type": "http.response.start", "status": 400, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
