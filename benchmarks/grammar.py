"""Constrained decoding on MaskBench: tgix's grammar compiler and outlines-core side by side.

For every schema (a file `{description, meta, schema, tests: [{valid, data}]}`), each engine
compiles the schema in its own worker process (cold: no cache; killed past the per-schema
limit), then replays every instance's tokens (the default model's tokenizer, `json.dumps`
layout, keys as-is and in schema order: accepted if either is), timing "mask + advance" per
token (write the state's packed allowed-token mask into a buffer, then step). A valid instance
is accepted when every token is allowed and EOS is allowed at the end; an invalid one that is
accepted is an invalidation error. Single-threaded by default (one schema at a time).

    python -m benchmarks.grammar                      # documented subset, both engines
    python -m benchmarks.grammar --all                # all 1427 schemas (~1 h on 2 cores)
    python -m benchmarks.grammar --limit 50 --no-peer --timeout 5
    python -m benchmarks.grammar --decode             # batch-8 decode step, grammar vs none

The peer needs `pip install -e ".[bench]"` (outlines-core). Results go to
benchmarks/results/grammar.json (`--json PATH`, `--json ''` for none).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import queue
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import harness
from benchmarks.grammar_engines import Worker, outlines_token_map
from benchmarks.grammar_instances import candidates

DATA = "/work/shared/data/maskbench"
DEFAULT_LIMIT = 200
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results", "grammar.json")
ENGINES = ("tgix", "outlines-core")


def select(files: list[str], limit: int | None) -> list[str]:
    """A deterministic subset: sorted names, every k-th, at most `limit`."""
    files = sorted(files)
    if not limit or limit >= len(files):
        return files
    return files[:: len(files) // limit][:limit]


def load_case(path: str, encode) -> dict:
    with open(path) as f:
        case = json.load(f)
    schema = case["schema"]
    tests = []
    for test in case.get("tests") or ():
        texts = candidates(test["data"], schema)
        tests.append((bool(test["valid"]), [encode(t) for t in texts]))
    return {"file": os.path.basename(path), "schema": json.dumps(schema), "tests": tests}


def make_workers(args, tok) -> dict[str, Worker]:
    from tgix.grammar.vocabulary import TokenVocabulary

    grace = args.timeout * 0.5 + 10  # tgix stops itself at --timeout; this is a backstop
    vocab = TokenVocabulary.from_tokenizer(tok.hf, eos_ids=tok.eos_token_ids)
    workers = {"tgix": Worker("tgix", (vocab, args.timeout), args.timeout + grace, 600)}
    if not args.no_peer:
        peer = (outlines_token_map(tok.hf), tok.eos_token_ids[0], len(tok.hf))
        workers["outlines-core"] = Worker("outlines", peer, args.timeout, 600)
    return workers


def run_all(args, tok, paths: list[str]) -> list[dict]:
    """Every schema through every engine; `--workers` slots run schemas concurrently."""

    def encode(text: str) -> list[int]:
        return tok.hf.encode(text, add_special_tokens=False)

    slots: queue.Queue = queue.Queue()
    for _ in range(args.workers):
        slots.put(make_workers(args, tok))
    started, done = time.perf_counter(), [0]

    def one(path: str) -> dict:
        case = load_case(path, encode)
        workers = slots.get()
        try:
            case["results"] = {n: w.run(case["schema"], case["tests"]) for n, w in workers.items()}
        finally:
            slots.put(workers)
        done[0] += 1
        if done[0] % 25 == 0 or done[0] == len(paths):
            elapsed = time.perf_counter() - started
            print(f"  {done[0]}/{len(paths)} schemas, {elapsed:.0f} s", file=sys.stderr)
        return case

    with ThreadPoolExecutor(args.workers) as pool:
        cases = list(pool.map(one, paths))
    while not slots.empty():
        for w in slots.get().values():
            w.close()
    return cases


def category(error: str) -> str:
    """An error message with numbers and long quoted or braced text folded, to count kinds."""
    text = error.splitlines()[0] if error else "?"
    text = re.sub(r"\{.*\}|\[.*\]", "{…}", text)
    text = re.sub(r"'[^']{40,}'|\"[^\"]{40,}\"", "'…'", text)
    return re.sub(r"\d+", "N", text)[:110]


def summarize(name: str, cases: list[dict], cap: float) -> dict:
    """One engine's figures over all schemas (timeouts counted at the cap where noted)."""
    import numpy as np

    res = [c["results"][name] for c in cases]
    statuses = collections.Counter(r["status"] for r in res)
    compiled = [(c, r) for c, r in zip(cases, res, strict=True) if r["status"] == "ok"]
    counts = collections.Counter()
    for c, r in compiled:
        for (valid, _), ok in zip(c["tests"], r["accepted"], strict=True):
            counts[(valid, ok)] += 1
    ok_times = [r["compile_s"] for _, r in compiled]
    all_times = [min(r["compile_s"], cap) if r["status"] != "timeout" else cap for r in res]
    times = [r["times"] for _, r in compiled if r["times"] is not None and len(r["times"])]
    per_token = np.concatenate(times) / 1e3 if times else np.zeros(0)
    errors = collections.Counter(category(r["error"]) for r in res if r["status"] != "ok")
    return {
        "schemas": len(res),
        "compiled": len(compiled),
        "status": dict(statuses),
        "valid_accepted": counts[(True, True)],
        "valid_total": counts[(True, True)] + counts[(True, False)],
        "invalid_accepted": counts[(False, True)],
        "invalid_total": counts[(False, True)] + counts[(False, False)],
        "compile_s_p50": harness.percentile(ok_times, 50),
        "compile_s_p90": harness.percentile(ok_times, 90),
        "compile_s_p50_all": harness.percentile(all_times, 50),
        "compile_s_p90_all": harness.percentile(all_times, 90),
        "mask_advance_us_p50": float(np.percentile(per_token, 50)) if per_token.size else None,
        "mask_advance_us_p99": float(np.percentile(per_token, 99)) if per_token.size else None,
        "mask_advance_us_max": float(per_token.max()) if per_token.size else None,
        "tokens_timed": int(per_token.size),
        "errors": dict(errors.most_common()),
    }


def both_compiled(cases: list[dict], cap: float) -> dict:
    """Each engine's figures on the schemas both compiled (the like-for-like comparison)."""
    common = [c for c in cases if all(c["results"][n]["status"] == "ok" for n in ENGINES)]
    return {"schemas": len(common), **{n: summarize(n, common, cap) for n in ENGINES}}


def report(summary: dict, common: dict | None) -> None:
    """The side-by-side table, then each engine's compile failures by kind."""

    def frac(a: int, b: int) -> str:
        return f"{a}/{b} ({100 * a / b:.1f}%)" if b else f"{a}/0"

    def num(v, scale: float = 1.0) -> float:
        return v * scale if v is not None else float("nan")

    fields = [
        ("schemas compiled", lambda s: frac(s["compiled"], s["schemas"])),
        ("status counts", lambda s: " ".join(f"{k}={v}" for k, v in s["status"].items())),
        ("valid accepted", lambda s: frac(s["valid_accepted"], s["valid_total"])),
        ("invalid accepted", lambda s: frac(s["invalid_accepted"], s["invalid_total"])),
        ("compile ms p50 (compiled)", lambda s: num(s["compile_s_p50"], 1e3)),
        ("compile ms p90 (compiled)", lambda s: num(s["compile_s_p90"], 1e3)),
        ("compile ms p50 (all, cap)", lambda s: num(s["compile_s_p50_all"], 1e3)),
        ("compile ms p90 (all, cap)", lambda s: num(s["compile_s_p90_all"], 1e3)),
        ("mask+advance us p50", lambda s: num(s["mask_advance_us_p50"])),
        ("mask+advance us p99", lambda s: num(s["mask_advance_us_p99"])),
        ("mask+advance us max", lambda s: num(s["mask_advance_us_max"])),
        ("tokens timed", lambda s: s["tokens_timed"]),
    ]
    rows = [[label, *(get(s) for s in summary.values())] for label, get in fields]
    if common:
        both = f"{common['schemas']} both compiled"
        for label, get in fields[2:6] + fields[8:10]:
            rows.append([f"{label}, {both}", *(get(common[n]) for n in summary)])
    harness.print_table("MaskBench: tgix vs outlines-core", ["metric", *summary], rows)
    for name, s in summary.items():
        top = [[v, k] for k, v in list(s["errors"].items())[: 15 if name == "tgix" else 8]]
        if top:
            harness.print_table(f"{name}: why schemas failed", ["count", "reason"], top)


def per_schema(cases: list[dict]) -> list[dict]:
    """Compact per-schema records for the JSON file."""
    out = []
    for c in cases:
        row: dict = {"file": c["file"]}
        for name, r in c["results"].items():
            flags = list(zip(c["tests"], r["accepted"], strict=False))
            row[name] = {
                "status": r["status"],
                "compile_s": r["compile_s"],
                "error": r["error"],
                "valid": [sum(ok for (v, _), ok in flags if v), sum(v for v, _ in c["tests"])],
                "invalid_accepted": sum(ok for (v, _), ok in flags if not v),
                **r["stats"],
            }
        out.append(row)
    return out


def source_state() -> dict:
    """The commit measured and tgix files changed on top of it (the working tree is what ran)."""
    import subprocess

    def git(*cmd: str) -> str:
        run = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=REPO)
        return run.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": git("status", "--porcelain", "tgix")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help="folder of MaskBench *.json files")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="schemas (every k-th)")
    parser.add_argument("--all", action="store_true", help="every schema (overrides --limit)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile limit per schema")
    parser.add_argument("--no-peer", action="store_true", help="tgix only (no outlines-core)")
    parser.add_argument("--workers", type=int, default=1, help="schemas compiled at once")
    parser.add_argument("--json", metavar="PATH", help=f"results file (default {RESULTS})")
    parser.add_argument("--decode", action="store_true", help="batch-8 decode, grammar vs none")
    parser.add_argument("--repeats", type=int, default=3, help="--decode: runs per mode")
    args = parser.parse_args(argv)
    if args.decode:
        from benchmarks.grammar_decode import run_decode

        results = run_decode(args)
        path = RESULTS.replace(".json", "_decode.json") if args.json is None else args.json
    else:
        results = run_maskbench(args)
        path = RESULTS if args.json is None else args.json
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        harness.write_json(path, results)


def run_maskbench(args) -> dict:
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    paths = select(glob.glob(os.path.join(args.data, "*.json")), None if args.all else args.limit)
    if not paths:
        raise SystemExit(f"no MaskBench files under {args.data}")
    tok = load_tokenizer(resolve_model(None))
    machine = harness.machine()
    print(f"{len(paths)} schemas, timeout {args.timeout:g} s, workers {args.workers}")
    started = time.perf_counter()
    cases = run_all(args, tok, paths)
    wall = time.perf_counter() - started
    names = [n for n in ENGINES if n in cases[0]["results"]]
    summary = {n: summarize(n, cases, args.timeout) for n in names}
    common = both_compiled(cases, args.timeout) if len(names) == 2 else None
    report(summary, common)
    print(f"\n{len(paths)} schemas in {wall:.0f} s")
    return {
        "benchmark": "grammar",
        "machine": dict(machine, loadavg_at_end=os.getloadavg()),
        "args": vars(args),
        "source": source_state(),
        "wall_s": wall,
        "engines": summary,
        "both_compiled": common,
        "schemas": per_schema(cases),
    }


if __name__ == "__main__":
    main()
