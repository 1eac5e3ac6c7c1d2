"""Shared helpers of the benchmarks: prompts, timed streams, statistics, tables, JSON, limits.

Not a benchmark itself; `benchmarks.engine`, `benchmarks.load_sweep` and `benchmarks.startup`
import it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tgix.engine.limits import LimitRequest

# Pinned KV budget (tokens): the engine sizes it from MemAvailable when unset, and a different
# size means different executables, so a "warm" start would compile again.
DEFAULT_KV_TOKENS = 32768


def random_prompt(rng, length: int) -> list[int]:
    """`length` token ids of ordinary (non-special) vocabulary."""
    return rng.integers(1000, 40000, size=length).tolist()


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated q-th percentile (q in 0..100); nan when empty."""
    values = sorted(values)
    if not values:
        return float("nan")
    pos = (len(values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


@dataclass
class TimedStream:
    """Token-event arrival times (time.perf_counter) of one request, read in its own thread."""

    submitted: float
    token_times: list[float] = field(default_factory=list)
    completion: object = None
    error: BaseException | None = None
    done: float = 0.0

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.submitted

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def read_stream(events: Iterable, record: TimedStream) -> None:
    """Consume a tgix stream (TokenEvents, then a Completion), stamping each token event."""
    from tgix.engine.request import TokenEvent

    try:
        for event in events:
            if isinstance(event, TokenEvent):
                record.token_times.append(time.perf_counter())
            else:
                record.completion = event
    except BaseException as exc:  # a GenerationError ends the stream; keep the run going
        record.error = exc
    record.done = time.perf_counter()


def run_requests(engine, requests: Sequence) -> list[TimedStream]:
    """Submit every GenerationRequest at once and read each stream in its own thread; a
    failed request keeps its error in its record."""
    start = time.perf_counter()
    streams = [engine.submit(r) for r in requests]
    records = [TimedStream(start) for _ in streams]
    threads = [
        threading.Thread(target=read_stream, args=(s, r), daemon=True)
        for s, r in zip(streams, records, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def run_batch(llm, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[TimedStream]:
    """Submit every prompt at once (greedy, ignore_eos) and read each stream in a thread."""
    from tgix.engine.request import GenerationRequest

    requests = [
        GenerationRequest(prompt_ids=tuple(p), max_new_tokens=max_new_tokens, ignore_eos=True)
        for p in prompts
    ]
    records = run_requests(llm.engine, requests)
    for r in records:
        if r.error is not None:
            raise RuntimeError(f"request failed: {r.error!r}") from r.error
    return records


def parse_limits(items: Sequence[str], kv_tokens: int) -> dict:
    """`--limit key=value` pairs (LimitRequest fields) plus the pinned KV budget (0: engine's)."""
    fields = LimitRequest.__dataclass_fields__
    out: dict = {}
    if kv_tokens:
        out["max_batch_total_tokens"] = kv_tokens
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--limit: unknown LimitRequest field {key!r}")
        kind = fields[key].type
        if "bool" in str(kind):
            out[key] = value.lower() in ("1", "true", "yes")
        elif "float" in str(kind):
            out[key] = float(value)
        else:
            out[key] = None if value.lower() == "none" else int(value)
    return out


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--kv-tokens",
        type=int,
        default=DEFAULT_KV_TOKENS,
        help="pin --max-batch-total-tokens (0: let the engine size it from free RAM)",
    )
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra LimitRequest field, e.g. --limit max_batch_size=8 (repeatable)",
    )


def machine() -> dict:
    import jax

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "loadavg_at_start": os.getloadavg(),
    }


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """A compact fixed-width table; floats with 3 significant-ish digits."""

    def fmt(v) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def write_json(path: str | None, results: dict) -> None:
    if path:  # benchmarks/results/ is ignored by git: a fresh checkout lacks it
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"\nwrote {path}")


def wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until 127.0.0.1:`port`/health answers 200; raises if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not become healthy (exit {proc.poll()})")
        time.sleep(0.25)
