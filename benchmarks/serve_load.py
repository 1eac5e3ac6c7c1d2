"""Closed-loop HTTP load generator for TGI- or OpenAI-compatible servers (tgix, TGI, vLLM,
llama.cpp's llama-server); loopback only, bounded in requests and time per level.

At each concurrency level C, C workers each send one streamed request at a time, taking the
next prompt in turn, until the level's request count has been started or its time limit has
passed (in-flight requests then finish or hit the client timeout). Greedy, fixed length:
OpenAI `/v1/completions` with `temperature 0, ignore_eos` (vLLM's extension, also tgix's),
or TGI `/generate_stream` with `max_new_tokens` (greedy by default; TGI has no ignore_eos, so
check `mean_tokens_per_request`). `sweep` runs the levels in order on one HTTP client, after
one untimed warm-up request, and each level continues where the last one stopped in the
prompt list, so no prompt repeats (no prefix-cache hits) while the list is long enough.

Token event (one per generated token, stamped with time.perf_counter() as its line arrives):
- tgi: a `data:` event carrying a "token" field.
- openai: a `data:` chunk with a `choices` entry whose `finish_reason` is null, "" or absent,
  or whose `text` is non-empty. A token with no visible text yet (partial UTF-8) still sends
  a chunk with `finish_reason` unset; the last token's chunk carries both text and a reason;
  a trailing chunk with a reason and no text (llama-server) or a usage-only chunk (empty
  `choices`) is not a token. `data: [DONE]` ends the stream.
- chat (`/v1/chat/completions`, used by benchmarks.chat_load): a chunk whose `delta.content`
  is non-empty (role-only first chunks, partial UTF-8 and usage-only chunks are not counted;
  `usage.completion_tokens` is the exact count); its text is kept in `RequestRecord.text`.
An error is an HTTP status other than 200, a `data:` event with an "error" field, or an
exception (including the client timeout): recorded and counted, never raised.

Metrics per level (seconds; p50/p90/p99 linear-interpolated, and the mean):
- ttft: request start -> its first token event (ok requests with a token).
- itl: gaps between consecutive token events of a request, pooled over ok requests.
- tpot: (last token - first token) / (tokens - 1) per ok request with >= 2 tokens.
- e2e: request start -> end of its stream (ok requests).
- wall_s: first request start -> last request end (every request).
- request_throughput: ok requests / wall_s; output_token_throughput: token events of every
  request / wall_s; tokens: that total; mean_tokens_per_request: over ok requests;
  server_reported_tokens: the sum of `usage.completion_tokens` where the stream carries it
  (tgix, vLLM with include_usage): when it differs from `tokens`, the server's chunks are
  not one per token (e.g. vLLM's --stream-interval > 1) and itl/tpot are per chunk.

Usage:
    python -m benchmarks.serve_load --url http://127.0.0.1:3000 [--api openai|tgi]
        [--concurrency 1 4 8 16 32 64] [--prompt-set synthetic text both] [--prompt-words 64]
        [--new-tokens 32] [--requests 8] [--rounds 1] [--time-limit 90] [--model tgi] [--json PATH]
        [--plot PATH] [--label NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.harness import percentile, print_table, write_json

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
_COMMON_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part over "
    "new sound take only little work know place year live me back give most very after thing "
    "our just name good sentence man think say great where help through much before line right"
)
COMMON_WORDS = _COMMON_TEXT.split()


def load_prompts(kind: str, count: int, words: int, seed: int = 0) -> list[str]:
    """`count` prompts of `words` words: "synthetic" (seeded draws from COMMON_WORDS) or "text"
    (contiguous runs of CPython's pydoc topics text from seeded start offsets)."""
    rng = np.random.default_rng(seed)
    if kind == "synthetic":
        draws = rng.integers(0, len(COMMON_WORDS), size=(count, words))
        return [" ".join(COMMON_WORDS[i] for i in row) for row in draws]
    if kind == "text":
        from pydoc_data.topics import topics

        corpus = " ".join(topics[k] for k in sorted(topics)).split()
        starts = rng.integers(0, len(corpus) - words, size=count)
        return [" ".join(corpus[s : s + words]) for s in starts]
    raise ValueError(f"unknown prompt set {kind!r} (synthetic or text)")


@dataclass
class RequestRecord:
    start: float
    token_times: list[float] = field(default_factory=list)
    end: float = 0.0
    error: str | None = None
    reported_tokens: int | None = None  # the server's usage.completion_tokens, when it sends one
    text: list[str] = field(default_factory=list)  # each token event's text (api "chat" only)


@dataclass(frozen=True)
class Target:
    """Where and what to send: one streamed greedy request of `new_tokens` per prompt."""

    url: str
    api: str
    new_tokens: int
    model: str = "tgi"
    timeout_s: float = 120.0

    def request(self, prompt: str) -> tuple[str, dict]:
        """(URL, JSON body) of one request."""
        if self.api == "openai":
            body = {"model": self.model, "prompt": prompt, "max_tokens": self.new_tokens}
            body |= {"temperature": 0, "stream": True, "ignore_eos": True}
            return self.url.rstrip("/") + "/v1/completions", body
        if self.api == "tgi":
            body = {"inputs": prompt, "parameters": {"max_new_tokens": self.new_tokens}}
            return self.url.rstrip("/") + "/generate_stream", body
        raise ValueError(f"unknown api {self.api!r} (openai or tgi)")


def chat_delta_text(payload: dict) -> str:
    """The content text of an OpenAI chat.completion.chunk ("" for role-only, usage-only or
    final chunks without content)."""
    choices = payload.get("choices") or []
    delta = (choices[0].get("delta") or {}) if choices else {}
    return delta.get("content") or ""


def is_token_event(api: str, payload: dict) -> bool:
    if api == "tgi":
        return "token" in payload
    if api == "chat":
        return bool(chat_delta_text(payload))
    choices = payload.get("choices") or []
    return bool(choices) and (not choices[0].get("finish_reason") or bool(choices[0].get("text")))


async def read_events(response: httpx.Response, api: str, record: RequestRecord) -> None:
    async for line in response.aiter_lines():
        arrived = time.perf_counter()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if "error" in payload:
            record.error = f"stream error: {str(payload['error'])[:200]}"
            return
        if is_token_event(api, payload):
            record.token_times.append(arrived)
            if api == "chat":
                record.text.append(chat_delta_text(payload))
        if isinstance(payload.get("usage"), dict):
            record.reported_tokens = payload["usage"].get("completion_tokens")


async def send_request(client: httpx.AsyncClient, target: Target, prompt: str) -> RequestRecord:
    url, body = target.request(prompt)
    record = RequestRecord(start=time.perf_counter())
    try:
        async with asyncio.timeout(target.timeout_s), client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                record.error = f"HTTP {r.status_code}: {text[:200]}"
            else:
                await read_events(r, target.api, record)
    except Exception as exc:  # timeouts, connection and JSON errors: counted, never raised
        record.error = f"{type(exc).__name__}: {exc}"[:200]
    record.end = time.perf_counter()
    return record


def stats(name: str, values: list[float]) -> dict[str, float]:
    out = {f"{name}_p{q}": percentile(values, q) for q in (50, 90, 99)}
    out[f"{name}_mean"] = sum(values) / len(values) if values else float("nan")
    return out


def summarize(concurrency: int, records: list[RequestRecord]) -> dict:
    ok = [r for r in records if r.error is None]
    timed = [r for r in ok if r.token_times]
    wall = max(r.end for r in records) - min(r.start for r in records) if records else 0.0
    tokens = sum(len(r.token_times) for r in records)
    ok_tokens = [len(r.token_times) for r in ok]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:], strict=False)]
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in (r.token_times for r in ok) if len(t) >= 2]
    errors = [r.error for r in records if r.error is not None]
    reported = [r.reported_tokens for r in records if r.reported_tokens is not None]
    return {
        "concurrency": concurrency,
        "requests": len(ok),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        **stats("ttft", [r.token_times[0] - r.start for r in timed]),
        **stats("itl", itl),
        **stats("tpot", tpot),
        **stats("e2e", [r.end - r.start for r in ok]),
        "request_throughput": len(ok) / wall if wall else float("nan"),
        "output_token_throughput": tokens / wall if wall else float("nan"),
        "tokens": tokens,
        "mean_tokens_per_request": sum(ok_tokens) / len(ok) if ok else float("nan"),
        "min_tokens_per_request": min(ok_tokens, default=0),
        "max_tokens_per_request": max(ok_tokens, default=0),
        "server_reported_tokens": sum(reported) if reported else None,
    }


async def run_level(
    url,
    api,
    prompts,
    concurrency,
    new_tokens,
    *,
    requests,
    time_limit_s,
    model="tgi",
    client_timeout_s=120,
) -> dict:
    """One closed-loop level (module docstring) on its own client; `sweep` shares one."""
    target = Target(url, api, new_tokens, model, client_timeout_s)
    async with new_client(concurrency, client_timeout_s) as client:
        return await closed_loop(client, target, prompts, concurrency, requests, time_limit_s)


async def closed_loop(client, target, prompts, concurrency, requests, time_limit_s) -> dict:
    records: list[RequestRecord] = []
    started = 0
    level_start = time.perf_counter()

    async def worker() -> None:
        nonlocal started
        while started < requests and time.perf_counter() - level_start < time_limit_s:
            prompt = prompts[started % len(prompts)]
            started += 1
            records.append(await send_request(client, target, prompt))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summarize(concurrency, records)


def new_client(connections: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=timeout_s, trust_env=False)


async def sweep(
    url,
    api,
    prompts,
    levels,
    new_tokens,
    *,
    requests_per_level: Callable[[int], int] | int,
    time_limit_s,
    model="tgi",
    client_timeout_s=120,
    warmup=1,
    rounds=1,
) -> list[dict]:
    """run_level at each concurrency in `levels`, in order, on one client. `requests_per_level`:
    a callable concurrency -> requests, or an int N meaning max(N, rounds x concurrency): with
    rounds > 1 every client sends several requests, so a level is not one arrival burst and its
    ramp-up and drain are a smaller share of its wall time. `warmup`
    untimed requests go first; each level starts in `prompts` where the previous one stopped."""
    if isinstance(requests_per_level, int):
        n = requests_per_level
        requests_per_level = lambda c: max(n, rounds * c)
    target = Target(url, api, new_tokens, model, client_timeout_s)
    results, offset = [], warmup
    async with new_client(max(levels), client_timeout_s) as client:
        for i in range(warmup):
            await send_request(client, target, prompts[i % len(prompts)])
        for c in levels:
            shifted = prompts[offset % len(prompts) :] + prompts[: offset % len(prompts)]
            result = await closed_loop(
                client, target, shifted, c, requests_per_level(c), time_limit_s
            )
            offset += result["requests"] + result["errors"]
            results.append(result)
            print(
                f"  concurrency {c}: {result['requests']} ok, {result['errors']} errors, "
                f"{result['output_token_throughput']:.1f} tok/s, {result['wall_s']:.1f} s",
                file=sys.stderr,
            )
    return results


def print_results(label: str, results: list[dict]) -> None:
    header = ["conc", "ok/err", "tok/s", "req/s", "TTFT p50/p90/p99 ms", "ITL p50/p99 ms"]
    header += ["TPOT p50 ms", "e2e p50/p90/p99 s"]

    def ms(r: dict, name: str, qs: tuple[int, ...]) -> str:
        return "/".join(f"{1000 * r[f'{name}_p{q}']:.1f}" for q in qs)

    rows = [
        [
            r["concurrency"],
            f"{r['requests']}/{r['errors']}",
            r["output_token_throughput"],
            r["request_throughput"],
            ms(r, "ttft", (50, 90, 99)),
            ms(r, "itl", (50, 99)),
            1000 * r["tpot_p50"],
            "/".join(f"{r[f'e2e_p{q}']:.2f}" for q in (50, 90, 99)),
        ]
        for r in results
    ]
    print_table(label, header, rows)


def plot(series: dict[str, list[dict]], path: str) -> bool:
    """Output tok/s against median TPOT and median TTFT (ms), a line per series."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, metric, title in zip(axes, ("tpot_p50", "ttft_p50"), ("TPOT", "TTFT"), strict=True):
        for label, results in series.items():
            xs = [1000 * r[metric] for r in results]
            ys = [r["output_token_throughput"] for r in results]
            ax.plot(xs, ys, marker="o", label=label)
            for x, y, r in zip(xs, ys, results, strict=True):
                offset = {"textcoords": "offset points", "xytext": (4, 4), "fontsize": 8}
                ax.annotate(str(r["concurrency"]), (x, y), **offset)
        ax.set(xlabel=f"median {title} (ms)", ylabel="output tokens/s", title=f"tok/s vs {title}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server base URL (loopback only)")
    p.add_argument("--api", choices=("openai", "tgi"), default="openai")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--prompt-set", choices=("synthetic", "text", "both"), default="synthetic")
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=8, help="per level: max(N, rounds x level)")
    p.add_argument("--rounds", type=int, default=1, help="requests per client per level, at least")
    p.add_argument("--time-limit", type=float, default=90.0, help="per level, seconds")
    p.add_argument("--model", default="tgi", help="OpenAI `model` field")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PATH")
    p.add_argument("--label", default="server", help="series name prefix in the plot")
    args = p.parse_args(argv)
    if urlsplit(args.url).hostname not in LOOPBACK_HOSTS:
        p.error(f"--url {args.url}: loopback only (127.0.0.1, localhost, ::1), per the rules")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    sets = ["synthetic", "text"] if args.prompt_set == "both" else [args.prompt_set]
    count = sum(max(args.requests, args.rounds * c) for c in args.concurrency) + 1  # + warm-up
    opts = {"requests_per_level": args.requests, "time_limit_s": args.time_limit}
    opts["rounds"] = args.rounds
    opts["model"] = args.model
    results = {}
    for kind in sets:
        print(f"{args.label}/{kind}: {args.api} at {args.url}", file=sys.stderr)
        prompts = load_prompts(kind, count, args.prompt_words)
        levels = sweep(args.url, args.api, prompts, args.concurrency, args.new_tokens, **opts)
        results[kind] = asyncio.run(levels)
        print_results(
            f"{args.label}/{kind} ({args.api}, {args.new_tokens} new tokens)", results[kind]
        )
    write_json(args.json, {"args": vars(args), "results": results})
    if args.plot:
        plot({f"{args.label}/{kind}": r for kind, r in results.items()}, args.plot)


if __name__ == "__main__":
    main()
