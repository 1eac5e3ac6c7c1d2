"""Soak: a default `python -m tgix.serve` under mixed traffic for a long time, watched.

    python -m benchmarks.soak [--minutes 20] [--concurrency 8] [--seed 0] [--port 3111]
        [--max-tokens 24] [--start-timeout 1200] [--json benchmarks/results/soak.json]
        [--trace [--tracemalloc N]]

Traffic: --concurrency closed-loop clients, each drawing a kind per request (seeded): plain
/generate, streamed /generate_stream, streamed chat, a JSON-schema chat, a tool call (streamed
or not), completions with n=2 and logprobs, /tokenize, a stream cancelled after two events, a
client that vanishes mid-stream (socket reset), and bad input (wrong types, deep nesting, an
overlong stop, overflowing numbers, malformed JSON). Watched meanwhile: the server's RSS every
5 s (its slope by least squares, MiB per minute, after the first minute's warm-up, and over
the second half alone: caches that fill early flatten there, a leak does not), /health's
latency every 0.5 s from its own thread, and KV pages (free + prefix-cached) once warm and
again after the load, when the server is idle.

Targets (issue "Hardening"): 0 responses >= 500, RSS slope within noise, pages back to the
baseline, /health p99 < 1 s. JSON with every figure in --json; the server's log beside it.
--trace serves through `benchmarks.traced_serve`, which watches malloc and Python's heap from
inside (and with --tracemalloc N, where allocations grew), to tell a leak from caches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks import traced_serve
from benchmarks.harness import print_table, wait_healthy, write_json
from server.heap import rss_mib

USER = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
        },
    },
}
BAD_BODIES = [
    '{"inputs": 5}',
    '{"inputs": "x", "parameters": {"max_new_tokens": "many"}}',
    '{"inputs": "x", "parameters": {"temperature": 1e999}}',
    '{"inputs": "x", "parameters": {"temperature": 1e-45}}',
    '{"inputs": "x", "parameters": {"stop": ["' + "s" * 20000 + '"]}}',
    '{"inputs": "x", "x": ' + "[" * 500 + '"\\ud800"' + "]" * 500 + "}",
    '{"inputs": "x"',
    '{"messages": [{"role": "user"}]}',
]


def pages(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line.startswith(
            (
                "tgix_kv_free_pages",
                "tgix_prefix_cache_cached_pages",
                "tgi_queue_size",
                "tgi_batch_current_size",
            )
        ):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 3:
        return float("nan")
    ts, ys = zip(*samples, strict=True)
    mean_t, mean_y = statistics.fmean(ts), statistics.fmean(ys)
    cov = sum((t - mean_t) * (y - mean_y) for t, y in samples)
    var = sum((t - mean_t) ** 2 for t in ts)
    return 60 * cov / var if var else float("nan")


class Watch(threading.Thread):
    """/health latency every 0.5 s and RSS every 5 s, until stopped."""

    def __init__(self, url: str, pid: int):
        super().__init__(daemon=True)
        self.url, self.pid, self.stop_flag = url, pid, threading.Event()
        self.health: list[float] = []
        self.health_failures = 0
        self.rss: list[tuple[float, float]] = []

    def run(self) -> None:
        start, next_rss = time.monotonic(), 0.0
        with httpx.Client(timeout=10) as client:
            while not self.stop_flag.is_set():
                t0 = time.monotonic()
                try:
                    ok = client.get(f"{self.url}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.health.append(time.monotonic() - t0)
                self.health_failures += not ok
                if t0 >= next_rss:
                    self.rss.append((t0 - start, rss_mib(self.pid) or float("nan")))
                    next_rss = t0 + 5.0
                self.stop_flag.wait(0.5)


async def one_request(client: httpx.AsyncClient, kind: str, rng: random.Random, args) -> str:
    """Runs one request of `kind`; returns the outcome label (a status code or an event)."""
    m = args.max_tokens
    if kind == "plain":
        body = {"inputs": "The sea is", "parameters": {"max_new_tokens": m}}
        return str((await client.post("/generate", json=body)).status_code)
    if kind in ("stream", "cancel"):
        body = {"inputs": "Waves are", "parameters": {"max_new_tokens": m}}
        async with client.stream("POST", "/generate_stream", json=body) as r:
            seen = 0
            async for _ in r.aiter_lines():
                seen += 1
                if kind == "cancel" and seen >= 3:
                    return "cancelled"
            return str(r.status_code)
    if kind == "chat":
        body = {
            "messages": USER,
            "max_tokens": m,
            "stream": True,
            "temperature": 0.7,
            "seed": rng.randrange(99),
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = "".join([line async for line in r.aiter_lines()])
            return str(r.status_code) if "[DONE]" in text else "no_done"
    if kind == "grammar":
        schema = {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        }
        body = {
            "messages": USER,
            "max_tokens": m,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema},
            },
        }
        return str((await client.post("/v1/chat/completions", json=body)).status_code)
    if kind == "tools":
        body = {
            "messages": USER,
            "tools": [WEATHER],
            "tool_choice": "required",
            "max_tokens": 48,
            "stream": rng.random() < 0.5,
        }
        return str((await client.post("/v1/chat/completions", json=body)).status_code)
    if kind == "completions":
        body = {"prompt": "Once", "max_tokens": m, "n": 2, "logprobs": 2, "temperature": 1.0}
        return str((await client.post("/v1/completions", json=body)).status_code)
    if kind == "tokenize":
        return str((await client.post("/tokenize", json={"inputs": "The sea " * 50})).status_code)
    if kind == "bad":
        body = rng.choice(BAD_BODIES)
        path = rng.choice(["/generate", "/v1/chat/completions", "/generate_stream"])
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        return str(r.status_code)
    raise ValueError(kind)


def vanish(port: int, max_tokens: int) -> str:
    """A client that opens a stream, reads a little, and resets the connection."""
    body = json.dumps({"inputs": "Tides", "parameters": {"max_new_tokens": max_tokens}}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /generate_stream HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    sock.recv(4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    return "vanished"


KINDS = [
    "plain",
    "stream",
    "chat",
    "grammar",
    "tools",
    "completions",
    "tokenize",
    "cancel",
    "vanish",
    "bad",
]


async def load(url: str, port: int, args) -> tuple[Counter, Counter, list[float]]:
    outcomes: Counter = Counter()
    kinds: Counter = Counter()
    latencies: list[float] = []
    deadline = time.monotonic() + 60 * args.minutes

    async def client_loop(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            while time.monotonic() < deadline:
                kind = rng.choice(KINDS)
                start = time.monotonic()
                try:
                    if kind == "vanish":
                        outcome = await asyncio.to_thread(vanish, port, args.max_tokens)
                    else:
                        outcome = await one_request(client, kind, rng, args)
                except (httpx.HTTPError, OSError) as exc:
                    outcome = f"client:{type(exc).__name__}"
                kinds[kind] += 1
                outcomes[outcome] += 1
                latencies.append(time.monotonic() - start)

    await asyncio.gather(*(client_loop(i) for i in range(args.concurrency)))
    return outcomes, kinds, latencies


def wait_idle(url: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        values = pages(url)
        if values.get("tgi_queue_size", 1) == 0 and values.get("tgi_batch_current_size", 1) == 0:
            return values
        if time.monotonic() > deadline:
            return values
        time.sleep(0.5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=3111)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--start-timeout", type=float, default=1200)
    p.add_argument("--json", default="benchmarks/results/soak.json")
    p.add_argument("--trace", action="store_true", help="serve via benchmarks.traced_serve")
    p.add_argument("--tracemalloc", type=int, default=0, help="frames per trace (with --trace)")
    args = p.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    log_path = Path(args.json).with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path = Path(args.json).with_suffix(".trace.jsonl")
    trace_path.unlink(missing_ok=True)
    module = "benchmarks.traced_serve" if args.trace else "tgix.serve"
    env = dict(
        os.environ, TGIX_MEMORY_TRACE=str(trace_path), TGIX_TRACEMALLOC=str(args.tracemalloc)
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(args.port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
    try:
        wait_healthy(args.port, proc, args.start_timeout)
        httpx.post(
            f"{url}/generate",
            json={"inputs": "warm", "parameters": {"max_new_tokens": 4}},
            timeout=120,
        )
        baseline = wait_idle(url)
        watch = Watch(url, proc.pid)
        watch.start()
        if args.trace:
            os.kill(proc.pid, signal.SIGUSR1)
        started = time.monotonic()
        outcomes, kinds, latencies = asyncio.run(load(url, args.port, args))
        elapsed = time.monotonic() - started
        after = wait_idle(url)
        watch.stop_flag.set()
        watch.join()
        if args.trace:
            os.kill(proc.pid, signal.SIGUSR2)  # the end row: snapshot diff and malloc_trim
            deadline = time.monotonic() + 120
            while '"mark": "end"' not in trace_path.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the traced server wrote no end row")
                time.sleep(1)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
    key = ("tgix_kv_free_pages", "tgix_prefix_cache_cached_pages")
    health = sorted(watch.health)
    p99 = health[int(0.99 * (len(health) - 1))] if health else float("nan")
    rss = [s for s in watch.rss if s[0] >= 60] or watch.rss
    results = {
        "minutes": elapsed / 60,
        "requests": sum(outcomes.values()),
        "kinds": dict(kinds),
        "outcomes": dict(outcomes),
        "responses_5xx": sum(n for o, n in outcomes.items() if o.isdigit() and int(o) >= 500),
        "rss_mib_start": watch.rss[0][1] if watch.rss else None,
        "rss_mib_end": watch.rss[-1][1] if watch.rss else None,
        "rss_slope_mib_per_min": slope_per_minute(rss),
        "rss_slope_second_half_mib_per_min": slope_per_minute(rss[len(rss) // 2 :]),
        "rss_series": [(round(t), round(m, 1)) for t, m in watch.rss],
        "pages_baseline": sum(baseline.get(k, 0) for k in key),
        "pages_after": sum(after.get(k, 0) for k in key),
        "health_p50_s": statistics.median(health) if health else None,
        "health_p99_s": p99,
        "health_failures": watch.health_failures,
        "request_p50_s": statistics.median(latencies) if latencies else None,
    }
    if args.trace:
        results["trace"] = traced_serve.summarise(str(trace_path), slope_per_minute)
    rows = [(k, str(v)) for k, v in results.items() if k not in ("rss_series", "trace")]
    print_table("soak", ["figure", "value"], rows)
    write_json(args.json, results)
    ok = results["responses_5xx"] == 0 and results["pages_after"] == results["pages_baseline"]
    return 0 if ok and p99 < 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
