"""Classic vs chunked prefill under load: time to first token and inter-token latency together.

    python -m benchmarks.load_sweep [--requests 24] [--rate 0.5 1.0] [--chunk-budgets 256]
        [--json results.json]
    python -m benchmarks.load_sweep --requests 6 --rate 1 --prompt-range 32 128 \
        --new-range 8 16 --chunk-budgets 128      # a quick shrunk run

An open-loop Poisson arrival of `--requests` requests at each `--rate` (mean requests/s;
seeded: the same prompts and the same arrival pattern, scaled, for every rate and mode), with
prompt lengths uniform in `--prompt-range` (random token ids) and new tokens uniform in
`--new-range` (greedy, ignore_eos), each streamed with `tgix.LLM.stream` in its own thread that
stamps every token event. Modes, one `LLM` each (built and warmed up, then every rate in turn):
classic (`LimitRequest(chunked_prefill=False)`, TGI's default prefill budget) and one chunked
mode per `--chunk-budgets` value (`LimitRequest(chunked_prefill=True,
max_batch_prefill_tokens=value)`: each step's tokens, decode rows included, stay within it).

Per mode and rate: TTFT (submit to first token) median and p90; ITL (gap between consecutive
token events of a request, pooled over all requests) median, p90 and p99; end-to-end latency
median; throughput = generated tokens / (first submit to last token); the engine's preemptions
and median host gap; and each chunked mode's ratios to classic at the same rate. The default
run takes about 4-5 minutes on an idle 2-core machine: about 1.5 minutes of traffic per mode,
plus start-up in a fresh TGIX_CACHE (the first mode compiles its buckets, the others reuse
those they share; `--cache DIR` keeps and reuses a cache between runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from benchmarks import harness
from benchmarks.harness import TimedStream, median, percentile, print_table, random_prompt


def workload(args, rate: float) -> list[dict]:
    """The arrival schedule: offset (s), prompt ids, max_new_tokens per request. The same seed
    gives the same prompts and the same arrival pattern, scaled, at every rate."""
    rng = np.random.default_rng(args.seed)
    gaps = rng.exponential(1 / rate, size=args.requests)
    gaps[0] = 0.0
    lo, hi = args.prompt_range
    nlo, nhi = args.new_range
    return [
        {
            "at": float(at),
            "prompt": random_prompt(rng, int(rng.integers(lo, hi + 1))),
            "new": int(rng.integers(nlo, nhi + 1)),
        }
        for at in np.cumsum(gaps)
    ]


def warm_up(llm, args) -> None:
    """Touch the step shapes the traffic uses (fresh prefills alone and together, decode)."""
    rng = np.random.default_rng(12345)
    lo, hi = args.prompt_range
    prompts = [random_prompt(rng, n) for n in (lo, (lo + hi) // 2, hi)]
    harness.run_batch(llm, prompts, 3)
    for p in prompts:
        harness.run_batch(llm, [p], 2)


def client(llm, req: dict, start: float, record: TimedStream) -> None:
    delay = start + req["at"] - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    record.submitted = time.perf_counter()
    events = llm.stream(req["prompt"], max_new_tokens=req["new"], ignore_eos=True)
    harness.read_stream(events, record)


def run_traffic(llm, requests: list[dict]) -> dict:
    """Replay one arrival schedule against a warm engine; latency and throughput figures."""
    before = llm.engine.stats()
    records = [TimedStream(0.0) for _ in requests]
    start = time.perf_counter() + 0.1
    threads = [
        threading.Thread(target=client, args=(llm, req, start, rec), daemon=True)
        for req, rec in zip(requests, records, strict=True)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stats = llm.engine.stats()
    failed = [r for r in records if r.error is not None]
    ok = [r for r in records if r.error is None and r.token_times]
    ttft = [r.ttft for r in ok]
    itl = [g for r in ok for g in r.itls]
    tokens = sum(len(r.token_times) for r in ok)
    span = max((r.token_times[-1] for r in ok), default=start) - min(r.submitted for r in records)
    return {
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({repr(r.error) for r in failed})[:3],
        "ttft_p50_s": median(ttft),
        "ttft_p90_s": percentile(ttft, 90),
        "itl_p50_s": median(itl),
        "itl_p90_s": percentile(itl, 90),
        "itl_p99_s": percentile(itl, 99),
        "e2e_p50_s": median(r.token_times[-1] - r.submitted for r in ok),
        "tok_s": tokens / span,
        "req_s": len(ok) / span,
        "steps": stats.get("steps", 0) - before.get("steps", 0),
        "preemptions": stats.get("preemptions", 0) - before.get("preemptions", 0),
        "host_gap_ms_median": stats.get("host_gap_ms_median"),
    }


def run_mode(name: str, limits, workloads: dict[float, list[dict]], args) -> list[dict]:
    """One engine for this mode, warmed up, then every rate's traffic in turn."""
    from tgix import LLM
    from tgix.engine.factory import EngineOptions

    t = time.perf_counter()
    llm = LLM(limits=limits, options=EngineOptions(progress=False))
    construct = time.perf_counter() - t
    results = []
    try:
        warm_up(llm, args)
        for rate, requests in workloads.items():
            r = {"mode": name, "rate": rate, "limits": str(limits), "construct_s": construct}
            r |= run_traffic(llm, requests)
            print(
                f"{name} @ {rate}/s: TTFT p50 {r['ttft_p50_s']:.2f} s, ITL p50 "
                f"{1e3 * r['itl_p50_s']:.0f} ms, {r['tok_s']:.1f} tok/s"
                + (f", {r['failed']} FAILED" if r["failed"] else ""),
                flush=True,
            )
            results.append(r)
    finally:
        llm.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument(
        "--rate", type=float, nargs="+", default=[0.5, 1.0], help="mean arrivals per second"
    )
    parser.add_argument("--prompt-range", type=int, nargs=2, default=[32, 512])
    parser.add_argument("--new-range", type=int, nargs=2, default=[32, 64])
    parser.add_argument(
        "--chunk-budgets",
        type=int,
        nargs="*",
        default=[256],
        help="max_batch_prefill_tokens of each chunked mode (none: classic only)",
    )
    parser.add_argument("--skip-classic", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", help="TGIX_CACHE to use and keep (default: a fresh one, removed at the end)"
    )
    harness.add_common_args(parser)
    args = parser.parse_args()

    from tgix.engine.limits import LimitRequest

    base = harness.parse_limits(args.limit, args.kv_tokens)
    modes = [] if args.skip_classic else [("classic", LimitRequest(**base))]
    for budget in args.chunk_budgets:
        fields = {**base, "chunked_prefill": True, "max_batch_prefill_tokens": budget}
        modes.append((f"chunked {budget}", LimitRequest(**fields)))
    workloads = {rate: workload(args, rate) for rate in args.rate}
    res: dict = {"machine": harness.machine(), "args": vars(args), "runs": []}
    first = workloads[args.rate[0]]
    print(
        f"{len(first)} requests a rate, {sum(len(r['prompt']) for r in first)} prompt tokens, "
        f"{sum(r['new'] for r in first)} new tokens; arrivals over "
        + ", ".join(f"{w[-1]['at']:.0f} s at {rate}/s" for rate, w in workloads.items()),
        flush=True,
    )
    cache = args.cache or tempfile.mkdtemp(prefix="tgix-sweep-cache-")
    os.environ["TGIX_CACHE"] = cache  # the modes share the executables they have in common
    try:
        for name, limits in modes:
            res["runs"] += run_mode(name, limits, workloads, args)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)

    runs = sorted(res["runs"], key=lambda m: m["rate"])
    rows = [
        [
            m["rate"],
            m["mode"],
            m["ttft_p50_s"],
            m["ttft_p90_s"],
            1e3 * m["itl_p50_s"],
            1e3 * m["itl_p90_s"],
            1e3 * m["itl_p99_s"],
            m["e2e_p50_s"],
            m["tok_s"],
            m["preemptions"],
            f"{m['completed']}/{m['completed'] + m['failed']}",
        ]
        for m in runs
    ]
    header = ["rate/s", "mode", "TTFT p50 s", "TTFT p90 s", "ITL p50 ms", "ITL p90 ms"]
    header += ["ITL p99 ms", "e2e p50 s", "tok/s", "preempt", "ok"]
    print_table(
        f"Load sweep: {args.requests} requests a rate (Poisson), prompts "
        f"{args.prompt_range[0]}-{args.prompt_range[1]} tokens, new {args.new_range[0]}-"
        f"{args.new_range[1]}",
        header,
        rows,
    )
    ref = {m["rate"]: m for m in runs if m["mode"] == "classic"}
    keys = ("ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "tok_s")
    ratios = [
        [m["rate"], m["mode"], *(m[k] / ref[m["rate"]][k] for k in keys)]
        for m in runs
        if m["mode"] != "classic" and m["rate"] in ref
    ]
    if ratios:
        print_table(
            "Ratios to classic at the same rate (< 1 is better for latencies, > 1 for tok/s)",
            ["rate/s", "mode", "TTFT p50", "TTFT p90", "ITL p50", "ITL p90", "ITL p99", "tok/s"],
            ratios,
        )
    harness.write_json(args.json, res)


if __name__ == "__main__":
    main()
