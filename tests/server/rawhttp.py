"""A minimal HTTP/1.1 client on a raw socket, for tests that need exact bytes or to hang up
mid-response (what real clients do when a user closes a tab)."""

from __future__ import annotations

import json
import socket
import time


class RawRequest:
    def __init__(self, port: int, path: str, body: dict, *, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        payload = json.dumps(body).encode()
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        self.buffer = b""

    def read_until(self, marker: bytes, timeout: float = 10.0) -> bytes:
        """Bytes received so far, once `marker` is among them."""
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{marker!r} not received; got {self.buffer!r}")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before {marker!r}; got {self.buffer!r}")
            self.buffer += chunk
        return self.buffer

    def read_all(self) -> bytes:
        while chunk := self.sock.recv(65536):
            self.buffer += chunk
        return self.buffer

    def hang_up(self) -> None:
        """Close abruptly (RST), like a killed client."""
        self.sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def wait_for(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
