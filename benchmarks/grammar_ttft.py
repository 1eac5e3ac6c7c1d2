"""Grammar TTFT over HTTP: first-token latency with a grammar new to the server vs cached.

A request whose grammar (JSON schema, tool set) the server has never seen, against the same
request again once that grammar is cached.

Called by benchmarks.grammar (`add_arguments`, `run_ttft`), or on its own:

    python -m benchmarks.grammar_ttft [--ttft-schemas 30] [--ttft-tool-sets 10]
        [--ttft-url http://127.0.0.1:PORT | --ttft-port N] [--ttft-json PATH]

Without --ttft-url it starts `python -m tgix.serve` (default model, --max-batch-total-tokens
as given, log in --ttft-log) and stops it at the end. Requests go one at a time (concurrency
1: latency, not queueing), streamed (SSE), over one keep-alive HTTP client
(serve_load.send_request). TTFT = the request's start (time.perf_counter() before it is sent)
-> the arrival of its first token event's line.

Workloads, each a list of (new, cached) pairs:
- json: N MaskBench schemas (every k-th of the sorted names, as benchmarks.grammar picks
  them). TGI `/generate_stream`, `parameters.grammar = {"type": "json", "value": schema}`,
  greedy, --ttft-max-new-tokens; token event: a `data:` event with a "token" field.
- tools: --ttft-tool-sets tool sets, one per BFCL_* MaskBench file (every k-th): its schema
  is `{name: parameters}` for one function, or an `anyOf` of such for several; each becomes
  a `tools` entry. OpenAI `/v1/chat/completions`, `stream: true`, `tool_choice: "required"`,
  temperature 0, --ttft-tool-max-tokens; token event: a chunk with a choice and no
  finish_reason (serve_load's "openai" rule), which here is a tool-call delta (the first one
  comes once the grammar-forced `{"function": {"_name": ...` is written, so this TTFT also
  holds those decode steps). A call cut short by max_tokens ends in an error event after its
  first delta: counted as cut_short, its TTFT kept.
Each pair: request 1 (new grammar: it pays the compile) then request 2, the same grammar
(an in-memory hit). The server caches compiled grammars on disk keyed by the spec, so every
schema and tool description carries this run's nonce: request 1 compiles even on a rerun.
The two requests' prompts differ only in a leading index, unique to every request, so
neither gets a prefix-cache hit the other lacks (--ttft-same-prompt: byte-identical repeats).
One untimed request of each kind goes first (a server's first grammar request pays one-offs).
A 422 before any token of request 1 (an HTTP status, or the error event tgix sends inside a
200 stream for a validation error: "Input validation error") is a grammar the compiler
refuses: counted (compile_failed), not repeated. errors: any other failure before a token
(status != 200, an error event such as 429 "overloaded", an exception or client timeout).

Figures per workload: TTFT p50/p90 (seconds) of new and cached requests, new_over_cached =
new p50 / cached p50 (target: <= 1.2), added_s p50/p90 = per pair new - cached (what the
new grammar added, not diluted by the decode steps in the tools TTFT); with the machine, the
git commit (and the tgix files changed on top of it) and every pair.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

from benchmarks import harness, serve_load

TARGET_RATIO = 1.2
WARM_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
USER = "Answer the request with a function call."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("grammar TTFT (benchmarks.grammar_ttft)")
    g.add_argument("--ttft-schemas", type=int, default=30, help="MaskBench JSON schemas")
    g.add_argument("--ttft-tool-sets", type=int, default=10, help="BFCL tool sets (0: none)")
    g.add_argument("--ttft-data", default="/work/shared/data/maskbench", help="MaskBench folder")
    g.add_argument("--ttft-url", help="an already running server (loopback) instead of one")
    g.add_argument("--ttft-port", type=int, help="port of the server started (default: free)")
    g.add_argument("--ttft-max-batch-total-tokens", type=int, default=4096)
    g.add_argument("--ttft-max-new-tokens", type=int, default=8, help="json requests")
    g.add_argument("--ttft-tool-max-tokens", type=int, default=32, help="tools requests")
    g.add_argument("--ttft-same-prompt", action="store_true", help="byte-identical repeats")
    g.add_argument("--ttft-timeout", type=float, default=180, help="client timeout, seconds")
    g.add_argument("--ttft-start-timeout", type=float, default=1200, help="seconds to /health")
    g.add_argument("--ttft-log", default="benchmarks/results/grammar_ttft.log", help="server log")


@dataclass(frozen=True)
class Request:
    """serve_load.send_request's target: one fixed (URL, body); `api` picks the token rule."""

    url: str
    body: dict
    api: str
    timeout_s: float

    def request(self, _prompt) -> tuple[str, dict]:
        return self.url, self.body


def json_cases(args, nonce: str) -> list[tuple[str, dict]]:
    """(file name, schema with the nonce in its top-level description)."""
    from benchmarks.grammar import select

    paths = select(glob.glob(os.path.join(args.ttft_data, "*.json")), args.ttft_schemas)
    out = []
    for path in paths:
        with open(path) as f:
            schema = json.load(f)["schema"]
        if isinstance(schema, dict):
            note = f"[ttft {nonce}] {schema.get('description', '')}".strip()
            schema = dict(schema, description=note)
        out.append((os.path.basename(path), schema))
    return out


def tool_cases(args, nonce: str) -> list[tuple[str, list[dict]]]:
    """(file name, tools): each BFCL function `{name: parameters}` as one OpenAI tool."""
    from benchmarks.grammar import select

    paths = glob.glob(os.path.join(args.ttft_data, "BFCL_*.json"))
    out = []
    for path in select(paths, args.ttft_tool_sets) if args.ttft_tool_sets else []:
        with open(path) as f:
            schema = json.load(f)["schema"]
        branches = schema.get("anyOf") or [schema]
        functions = [kv for b in branches for kv in (b.get("properties") or {}).items()]
        tools = [
            {"type": "function", "function": {
                "name": name, "description": f"{name} [ttft {nonce}]", "parameters": params}}
            for name, params in functions
        ]  # fmt: skip
        if tools:
            out.append((os.path.basename(path), tools))
    return out


def json_request(url: str, args, schema, tag: str) -> Request:
    params = {"max_new_tokens": args.ttft_max_new_tokens, "do_sample": False}
    params["grammar"] = {"type": "json", "value": schema}
    inputs = f"[{tag}] Write one JSON value that fits the schema.\n"
    return Request(f"{url}/generate_stream", {"inputs": inputs, "parameters": params}, "tgi",
                   args.ttft_timeout)  # fmt: skip


def tools_request(url: str, args, tools: list[dict], tag: str) -> Request:
    body = {"model": "tgi", "messages": [{"role": "user", "content": f"[{tag}] {USER}"}]}
    body |= {"tools": tools, "tool_choice": "required", "stream": True, "temperature": 0}
    body["max_tokens"] = args.ttft_tool_max_tokens
    return Request(f"{url}/v1/chat/completions", body, "openai", args.ttft_timeout)


def ttft(record: serve_load.RequestRecord | None) -> float | None:
    return record.token_times[0] - record.start if record and record.token_times else None


def warm_grammar(name: str, nonce: str):
    """The untimed first request's grammar: a small schema of its own, or one tool with it."""
    schema = dict(WARM_SCHEMA, description=f"warm {nonce}")
    if name == "json":
        return schema
    return [{"type": "function", "function": {"name": "warm_up", "parameters": schema}}]


async def measure(url: str, args, nonce: str) -> dict:
    """Every pair of both workloads, in order, on one client."""
    workloads = {"json": (json_cases(args, nonce), json_request)}
    workloads["tools"] = (tool_cases(args, nonce), tools_request)
    out: dict = {}
    counter = 0
    async with serve_load.new_client(1, args.ttft_timeout) as client:
        for name, (cases, make) in workloads.items():
            if not cases:
                continue
            warm = make(url, args, warm_grammar(name, nonce), "warm")
            warm = await serve_load.send_request(client, warm, None)
            if warm.error:
                print(f"  {name} warm-up: {warm.error}", file=sys.stderr)
            pairs = []
            for case, grammar in cases:
                first = make(url, args, grammar, str(counter))
                again = first if args.ttft_same_prompt else make(url, args, grammar, f"{counter}b")
                counter += 1
                new = await serve_load.send_request(client, first, None)
                skip = refused(new)
                cached = None if skip else await serve_load.send_request(client, again, None)
                pairs.append({"case": case, "new": new, "cached": cached, "refused": skip})
            out[name] = summarize(name, pairs)
    return out


def refused(record: serve_load.RequestRecord) -> bool:
    """A grammar the compiler refuses: a 422 before any token, as a status or as the stream's
    error event (how tgix reports validation errors inside a 200 stream)."""
    error = record.error or ""
    return not record.token_times and (
        error.startswith("HTTP 422") or "Input validation error" in error
    )


def summarize(name: str, pairs: list[dict]) -> dict:
    records = [r for p in pairs for r in (p["new"], p["cached"]) if r is not None]
    failed = [r.error for r in records if r.error and not r.token_times and not refused(r)]
    cut_short = [r for r in records if r.error and r.token_times]
    skipped = [p["case"] for p in pairs if p["refused"]]
    times = [(ttft(p["new"]), ttft(p["cached"])) for p in pairs]
    new = [a for a, _ in times if a is not None]
    cached = [b for _, b in times if b is not None]
    added = [a - b for a, b in times if a is not None and b is not None]
    rows = [
        {"case": p["case"], "new_ttft": a, "cached_ttft": b, "new_error": p["new"].error,
         "cached_error": p["cached"].error if p["cached"] else None}
        for p, (a, b) in zip(pairs, times, strict=True)
    ]  # fmt: skip
    new_p50, cached_p50 = harness.percentile(new, 50), harness.percentile(cached, 50)
    result = {
        "cases": len(pairs),
        "compile_failed": len(skipped),
        "compile_failed_cases": skipped,
        "requests": len(records),
        "timed_pairs": len(added),
        "errors": len(failed),
        "cut_short": len(cut_short),
        "no_token": sum(1 for r in records if not r.error and not r.token_times),
        "first_error": failed[0] if failed else None,
        "new_ttft_p50": new_p50,
        "new_ttft_p90": harness.percentile(new, 90),
        "cached_ttft_p50": cached_p50,
        "cached_ttft_p90": harness.percentile(cached, 90),
        "new_over_cached": harness.ratio(new_p50, cached_p50),
        "added_s_p50": harness.percentile(added, 50),
        "added_s_p90": harness.percentile(added, 90),
        "pairs": rows,
    }
    result["within_target"] = result["new_over_cached"] <= TARGET_RATIO
    print(f"  {name}: {len(pairs)} cases, {len(skipped)} refused (422)", file=sys.stderr)
    return result


def report(workloads: dict) -> None:
    header = ["workload", "cases", "422", "errors", "cut short", "new p50/p90 ms"]
    header += ["cached p50/p90 ms", "new/cached p50", f"<= {TARGET_RATIO}", "added p50/p90 ms"]

    def ms(r: dict, kind: str) -> str:
        return f"{1000 * r[f'{kind}_ttft_p50']:.0f}/{1000 * r[f'{kind}_ttft_p90']:.0f}"

    rows = [
        [name, r["cases"], r["compile_failed"], r["errors"], r["cut_short"],
         ms(r, "new"), ms(r, "cached"), r["new_over_cached"],
         "PASS" if r["within_target"] else "FAIL",
         f"{1000 * r['added_s_p50']:.0f}/{1000 * r['added_s_p90']:.0f}"]
        for name, r in workloads.items()
    ]  # fmt: skip
    harness.print_table("grammar TTFT: new grammar vs the same again (concurrency 1)", header, rows)


def start_server(args):
    """chat_load's tgix launcher (prefix caching on, TGI's default) on --ttft-port or a free
    port; returns (process, port)."""
    from benchmarks.chat_load import start_tgix
    from benchmarks.peers import free_port

    port = args.ttft_port or free_port()
    Path(args.ttft_log).parent.mkdir(parents=True, exist_ok=True)
    opts = SimpleNamespace(
        kv_tokens=args.ttft_max_batch_total_tokens, start_timeout=args.ttft_start_timeout
    )
    started = time.perf_counter()
    proc = start_tgix(port, Path(args.ttft_log), opts, prefix_caching=True)
    print(f"tgix on port {port}: healthy after {time.perf_counter() - started:.0f} s")
    return proc, port


def run_ttft(args) -> dict:
    """Both workloads against --ttft-url or a server started here; the results dict."""
    from benchmarks.grammar import source_state
    from benchmarks.peers import stop

    if args.ttft_url and urlsplit(args.ttft_url).hostname not in serve_load.LOOPBACK_HOSTS:
        raise SystemExit(f"--ttft-url {args.ttft_url}: loopback only")
    nonce = uuid.uuid4().hex[:12]
    machine = harness.machine()
    proc = None
    if args.ttft_url:
        url = args.ttft_url.rstrip("/")
    else:
        proc, port = start_server(args)
        url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    try:
        workloads = asyncio.run(measure(url, args, nonce))
    finally:
        if proc is not None:
            stop(proc)
    report(workloads)
    return {
        "benchmark": "grammar_ttft",
        "machine": dict(machine, loadavg_at_end=os.getloadavg()),
        "source": source_state(),
        "args": {k: v for k, v in vars(args).items() if k.startswith("ttft_")},
        "url": url,
        "server_started": proc is not None,
        "nonce": nonce,
        "wall_s": time.perf_counter() - started,
        "target_ratio": TARGET_RATIO,
        "workloads": workloads,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--ttft-json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    harness.write_json(args.ttft_json, run_ttft(args))


if __name__ == "__main__":
    main()
