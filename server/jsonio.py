"""JSON in and out, byte-compatible with TGI (serde_json behind axum).

Out: compact separators, UTF-8 (no ASCII escaping), and float32 values written with their
shortest float32 form (`-1.53`, not `-1.5299999713897705`), as serde writes an f32; NaN and
infinities become null. In: the body is read with a byte limit, must be UTF-8 JSON without
NaN/Infinity literals, lone surrogate escapes or nesting deeper than 128 levels; failures
are TGI's plain-text 4xx.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import struct
import time
from typing import Any

from starlette.requests import ClientDisconnect, Request

from server.errors import PlainError

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_SURROGATE = re.compile(r"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
BODY_TIMEOUT_S = 30.0  # a request body must arrive within this (slow-body clients)
DRAIN_BYTES = 16 << 20  # read and dropped before a 413, so the answer reaches the client
DRAIN_S = 1.0  # ... for at most this long
MAX_DEPTH = 128  # nested arrays / objects in a body (serde_json's recursion limit, as TGI's)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, the way serde_json writes it."""
    return _ENCODER.encode(value).encode("utf-8")


def f32(value: float | None) -> float | None:
    """A float as serde writes an f32: shortest decimal that round-trips through float32.
    Non-finite values (the first prompt token's NaN logprob) serialise as null."""
    if value is None or not math.isfinite(value):
        return None
    try:
        target = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return None
    if not math.isfinite(target):  # beyond float32's range: an f32 would be infinite
        return None
    for digits in range(1, 10):
        short = float(f"{target:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == target:
            return short
    return target


def _syntax(reason: str) -> PlainError:
    return PlainError(400, f"Failed to parse the request body as JSON: {reason}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"expected value ({name} is not JSON)")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays / objects nest more than `limit` levels (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _is_json_content_type(value: str | None) -> bool:
    """axum's rule: application/json or application/<anything>+json, parameters ignored."""
    if not value:
        return False
    mime = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing a missing JSON content type (415), more than `limit` bytes
    (413, whether the size is announced or only seen while streaming) and a body that takes
    more than BODY_TIMEOUT_S to arrive (408). An announced oversize is refused before any of
    the body is read (uvicorn reads and drops what follows); one found while streaming is read
    on and dropped, up to DRAIN_BYTES or DRAIN_S, before the 413, so a client that sends
    everything before reading still gets the answer (servers' "lingering close")."""
    if not _is_json_content_type(request.headers.get("content-type")):
        raise PlainError(415, "Expected request with `Content-Type: application/json`")
    too_large = PlainError(413, "Failed to buffer the request body: length limit exceeded")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size, drain_until = [], 0, None
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                    continue
                drain_until = drain_until or time.monotonic() + DRAIN_S
                if size > limit + DRAIN_BYTES or time.monotonic() > drain_until:
                    break
    except TimeoutError:
        raise PlainError(408, "Timed out reading the request body") from None
    except ClientDisconnect:
        if drain_until is None:
            raise
    if drain_until is not None:
        raise too_large
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """Bytes -> Python value, or TGI's 400 plain-text syntax error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _syntax(f"invalid unicode code point at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        reason = exc.msg[0].lower() + exc.msg[1:]
        raise _syntax(f"{reason} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise _syntax(str(exc)) from None
    except RecursionError:
        raise _syntax("recursion limit exceeded") from None
    # every walker after this one may recurse safely; a body with fewer brackets than the
    # limit cannot nest deeper (str.count is C speed: most bodies skip the walk)
    openers = text.count("[") + text.count("{")
    if openers > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise _syntax("recursion limit exceeded")
    if _SURROGATE.search(text) and _has_lone_surrogate(value):
        raise _syntax("lone surrogate in hex escape")
    return value


async def read_json(request: Request, limit: int) -> Any:
    return parse_json(await read_body(request, limit))
