"""Images in prompts (host only): TGI's markdown form `![](url)` found in a prompt, each URL
fetched and decoded into a PIL image, every failure a 422 that names it.

URLs are `data:` URIs (base64 or percent-encoded) or http(s). A fetch reads at most
`max_bytes`, gives up after `timeout` seconds (connect and each read), follows at most three
redirects and refuses every address that is not public (loopback, private, link-local,
reserved, multicast) unless `allow_private` is set, checked again at each redirect. The
decode reads the header first: formats other than PNG, JPEG, GIF, WebP and BMP, images
smaller than MIN_SIDE or larger than `max_pixels` are refused before any pixel is decoded
(a 20000x20000 header costs nothing), and a truncated file fails its full decode.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import ipaddress
import re
import socket
import urllib.error
import urllib.parse
import urllib.request

from server import errors

MARKDOWN_IMAGE = re.compile(r"!\[\]\(([^)]*)\)")  # TGI's chunking of `inputs`
FORMATS = {"PNG", "JPEG", "GIF", "WEBP", "BMP"}
MIN_SIDE = 8  # pixels: smaller images have no patch grid worth encoding
MAX_REDIRECTS = 3


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ImageLimits:
    """What one request's images may cost (the launcher's image flags)."""

    max_images: int = 8
    max_bytes: int = 20_000_000
    max_pixels: int = 40_000_000
    timeout: float = 10.0
    allow_private: bool = False


def split_markdown(text: str, placeholder: str) -> tuple[str, list[str]]:
    """`text` with every `![](url)` replaced by `placeholder` (the model's image token), and
    the URLs in order."""
    urls: list[str] = []

    def take(match: re.Match) -> str:
        urls.append(match.group(1))
        return placeholder

    return MARKDOWN_IMAGE.sub(take, text), urls


def load_images(urls: list[str], limits: ImageLimits) -> list:
    """Fetch and decode every URL (PIL images, RGB), or raise the first failure's 422."""
    if len(urls) > limits.max_images:
        raise errors.validation(
            f"at most {limits.max_images} images per request. Given: {len(urls)}"
        )
    return [decode_image(fetch(url, limits), limits, i) for i, url in enumerate(urls)]


def fetch(url: str, limits: ImageLimits) -> bytes:
    """The bytes behind a data: or http(s) URL (raises a 422 ApiError)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_uri(url, limits.max_bytes)
    if scheme not in ("http", "https"):
        raise errors.validation(f"image URL scheme `{scheme or url[:16]}` is not supported")
    opener = urllib.request.build_opener(_Redirects(limits), _NoProxy())
    _check_host(url, limits)
    try:
        with opener.open(url, timeout=limits.timeout) as response:
            kind = response.headers.get_content_type()
            if not kind.startswith("image/"):
                raise errors.validation(f"image URL returned `{kind}`, not an image")
            body = response.read(limits.max_bytes + 1)
    except errors.ApiError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise errors.validation(f"image URL could not be fetched: {reason}") from None
    if len(body) > limits.max_bytes:
        raise errors.validation(f"image is larger than {limits.max_bytes} bytes")
    return body


def _data_uri(url: str, max_bytes: int) -> bytes:
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise errors.validation("malformed data URI (no `,`)")
    kind, *params = head.split(";")
    if kind and not kind.lower().startswith("image/"):
        raise errors.validation(f"data URI type `{kind}` is not an image")
    if len(payload) > max_bytes * 4 // 3 + 4:
        raise errors.validation(f"image is larger than {max_bytes} bytes")
    try:
        if "base64" in (p.lower() for p in params):
            return base64.b64decode(payload, validate=True)
        return urllib.parse.unquote_to_bytes(payload)
    except ValueError:
        raise errors.validation("data URI is not valid base64") from None


def _check_host(url: str, limits: ImageLimits) -> None:
    """Refuse a host that resolves to any non-public address (unless allowed)."""
    host = urllib.parse.urlsplit(url).hostname
    if not host:
        raise errors.validation("image URL has no host")
    if limits.allow_private:
        return
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        raise errors.validation(f"image URL host `{host}` does not resolve") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global or address.is_multicast:
            raise errors.validation(f"image URL host `{host}` is not a public address")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """At most MAX_REDIRECTS, each target's host checked like the first."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, limits: ImageLimits):
        super().__init__()
        self.limits = limits

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise errors.validation("image URL redirects to a scheme that is not http(s)")
        _check_host(newurl, self.limits)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _NoProxy(urllib.request.ProxyHandler):
    """Environment proxies are ignored: the address check is of the host itself."""

    def __init__(self):
        super().__init__({})


def decode_image(data: bytes, limits: ImageLimits, index: int = 0):
    """A PIL image (RGB) from encoded bytes, size-checked from its header before decoding."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as probe:
            kind, (width, height) = probe.format, probe.size
    except Image.DecompressionBombError:
        raise errors.validation(f"image {index} has more than {limits.max_pixels} pixels") from None
    except Exception:
        raise errors.validation(f"image {index} could not be decoded") from None
    if kind not in FORMATS:
        raise errors.validation(f"image {index}: format `{kind}` is not supported")
    if width * height > limits.max_pixels:
        raise errors.validation(
            f"image {index} is {width}x{height}: more than {limits.max_pixels} pixels"
        )
    if min(width, height) < MIN_SIDE:
        raise errors.validation(
            f"image {index} is {width}x{height}: each side must be at least {MIN_SIDE} pixels"
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # a truncated file fails here
            return image.convert("RGB")
    except Exception:
        raise errors.validation(f"image {index} could not be decoded (truncated?)") from None
