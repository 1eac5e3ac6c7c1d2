"""Constrained decoding on MaskBench: tgix's grammar compiler, outlines-core and llguidance.

For every schema (a file `{description, meta, schema, tests: [{valid, data}]}`), each engine
compiles the schema in its own worker process (cold: no cache; killed past the per-schema
limit) and writes the start state's mask ("first mask": compile + that fill, what a request
waits for before its first constrained token), then replays every instance's tokens (the
default model's tokenizer, `json.dumps` layout, keys as-is and in schema order: accepted if
either is), timing "mask + advance" per token (write the state's packed allowed-token mask
into a buffer, then step), then replays the valid instances again ("again": states already
built, what lazy engines cost once warm). A valid instance is accepted when every token is
allowed and EOS is allowed at the end; an invalid one that is accepted is an invalidation
error. Single-threaded by default (one schema at a time).

    python -m benchmarks.grammar                      # documented subset, all three engines
    python -m benchmarks.grammar --all                # all 1427 schemas
    python -m benchmarks.grammar --limit 50 --no-peer --timeout 5 --tgix-mode both
    python -m benchmarks.grammar --engines tgix,llguidance
    python -m benchmarks.grammar --decode             # batch-8 decode step, grammar vs none
    python -m benchmarks.grammar --ttft               # benchmarks.grammar_ttft

`--tgix-mode lazy|eager|both`: `GrammarCompiler(lazy=True)` (engine `tgix`, masks built the
first time a state is reached), `lazy=False` (`tgix-eager`), or both side by side. The peers
need `pip install -e ".[bench]"` (outlines-core, llguidance). Results go to
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
from benchmarks.grammar_engines import make_workers
from benchmarks.grammar_instances import candidates

DATA = "/work/shared/data/maskbench"
DEFAULT_LIMIT = 200
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results", "grammar.json")
FAMILIES = ("tgix", "outlines-core", "llguidance")


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


def engine_names(args) -> list[str]:
    """The engines run, in table order: `tgix` (lazy) and/or `tgix-eager`, then the peers."""
    chosen = [e.strip() for e in args.engines.split(",") if e.strip()]
    if unknown := set(chosen) - set(FAMILIES):
        raise SystemExit(f"--engines: unknown {sorted(unknown)}; choose from {FAMILIES}")
    if args.no_peer:
        chosen = ["tgix"]
    tgix = {"lazy": ["tgix"], "eager": ["tgix-eager"], "both": ["tgix", "tgix-eager"]}
    names = tgix[args.tgix_mode] if "tgix" in chosen else []
    return names + [f for f in FAMILIES[1:] if f in chosen]


def run_all(args, tok, paths: list[str], names: list[str]) -> list[dict]:
    """Every schema through every engine; `--workers` slots run schemas concurrently."""

    def encode(text: str) -> list[int]:
        return tok.hf.encode(text, add_special_tokens=False)

    slots: queue.Queue = queue.Queue()
    for _ in range(args.workers):
        slots.put(make_workers(args, tok, names))
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
    """One engine's figures over all schemas. "_all" percentiles count timeouts at the cap
    (compile) or every schema without a first mask at the cap (first mask)."""
    import numpy as np

    res = [c["results"][name] for c in cases]
    compiled = [(c, r) for c, r in zip(cases, res, strict=True) if r["status"] == "ok"]
    counts = collections.Counter()
    for c, r in compiled:
        for (valid, _), ok in zip(c["tests"], r["accepted"], strict=True):
            counts[(valid, ok)] += 1
    out = {
        "schemas": len(res),
        "compiled": len(compiled),
        "status": dict(collections.Counter(r["status"] for r in res)),
        "valid_accepted": counts[(True, True)],
        "valid_total": counts[(True, True)] + counts[(True, False)],
        "valid_rejected": counts[(True, False)],
        "invalid_accepted": counts[(False, True)],
        "invalid_total": counts[(False, True)] + counts[(False, False)],
    }
    first = [cap if r["first_mask_s"] is None else min(r["first_mask_s"], cap) for r in res]
    spans = {
        "compile_s": [min(r["compile_s"], cap) if r["status"] != "timeout" else cap for r in res],
        "first_mask_s": first,
    }
    for key, every in spans.items():
        ok = [r[key] for _, r in compiled]
        for q in (50, 90):
            out[f"{key}_p{q}"] = harness.percentile(ok, q)
            out[f"{key}_p{q}_all"] = harness.percentile(every, q)
    for key, field in (("mask_advance", "times"), ("mask_advance_again", "times_again")):
        times = [r[field] for _, r in compiled if r[field] is not None and len(r[field])]
        us = np.concatenate(times) / 1e3 if times else np.zeros(0)
        for label, q in (("p50", 50), ("p99", 99), ("max", 100)):
            out[f"{key}_us_{label}"] = float(np.percentile(us, q)) if us.size else None
        out["tokens_timed" if field == "times" else "tokens_timed_again"] = int(us.size)
    errors = collections.Counter(category(r["error"]) for r in res if r["status"] != "ok")
    out["errors"] = dict(errors.most_common())
    return out


def all_compiled(cases: list[dict], names: list[str], cap: float) -> dict:
    """Each engine's figures on the schemas every engine compiled (like for like)."""
    common = [c for c in cases if all(c["results"][n]["status"] == "ok" for n in names)]
    return {"schemas": len(common), **{n: summarize(n, common, cap) for n in names}}


def report(summary: dict, common: dict | None) -> None:
    """The side-by-side table, then each engine's compile failures by kind."""

    def frac(a: int, b: int) -> str:
        return f"{a}/{b} ({100 * a / b:.1f}%)" if b else f"{a}/0"

    def num(key: str, scale: float = 1.0):
        return lambda s: s[key] * scale if s[key] is not None else float("nan")

    fields = [
        ("schemas compiled", lambda s: frac(s["compiled"], s["schemas"])),
        ("status counts", lambda s: " ".join(f"{k}={v}" for k, v in s["status"].items())),
        ("valid accepted", lambda s: frac(s["valid_accepted"], s["valid_total"])),
        ("valid rejected", lambda s: s["valid_rejected"]),
        ("invalid accepted", lambda s: frac(s["invalid_accepted"], s["invalid_total"])),
    ]
    for key, label in (("compile_s", "compile"), ("first_mask_s", "first mask")):
        for q in ("p50", "p90"):
            fields.append((f"{label} ms {q} (compiled)", num(f"{key}_{q}", 1e3)))
        for q in ("p50", "p90"):
            fields.append((f"{label} ms {q} (all, cap)", num(f"{key}_{q}_all", 1e3)))
    for key, tag in (("mask_advance", ""), ("mask_advance_again", " (again)")):
        for q in ("p50", "p99", "max"):
            fields.append((f"mask+advance us {q}{tag}", num(f"{key}_us_{q}")))
    fields.append(("tokens timed", lambda s: s["tokens_timed"]))
    rows = [[label, *(get(s) for s in summary.values())] for label, get in fields]
    if common:
        tag = f"{common['schemas']} all compiled"
        for label, get in fields[2:7] + fields[9:11] + fields[13:15] + fields[16:18]:
            rows.append([f"{label}, {tag}", *(get(common[n]) for n in summary)])
    harness.print_table(f"MaskBench: {' vs '.join(summary)}", ["metric", *summary], rows)
    for name, s in summary.items():
        top = [[v, k] for k, v in list(s["errors"].items())[: 15 if "tgix" in name else 8]]
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
                "first_mask_s": r["first_mask_s"],
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
    add = parser.add_argument
    add("--data", default=DATA, help="folder of MaskBench *.json files")
    add("--limit", type=int, default=DEFAULT_LIMIT, help="schemas (every k-th)")
    add("--all", action="store_true", help="every schema (overrides --limit)")
    add("--timeout", type=float, default=10.0, help="compile limit per schema")
    add("--engines", default=",".join(FAMILIES), help=f"comma list of {', '.join(FAMILIES)}")
    add("--tgix-mode", choices=("lazy", "eager", "both"), default="lazy", help="tgix's masks")
    add("--no-peer", action="store_true", help="tgix only (overrides --engines)")
    add("--llg-whitespace", metavar="REGEX", help="llguidance whitespace_pattern, e.g. '[ ]?'")
    add("--workers", type=int, default=1, help="schemas compiled at once")
    add("--json", metavar="PATH", help=f"results file (default {RESULTS})")
    add("--decode", action="store_true", help="batch-8 decode, grammar vs none")
    add("--repeats", type=int, default=3, help="--decode: runs per mode")
    add("--ttft", action="store_true", help="time to first token (benchmarks.grammar_ttft)")
    try:
        from benchmarks import grammar_ttft
    except ImportError:
        grammar_ttft = None
    else:
        grammar_ttft.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.ttft:
        if grammar_ttft is None:
            raise SystemExit("--ttft needs benchmarks/grammar_ttft.py")
        results = grammar_ttft.run_ttft(args)
        path = RESULTS.replace(".json", "_ttft.json") if args.json is None else args.json
    elif args.decode:
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
    names = engine_names(args)
    tok = load_tokenizer(resolve_model(None))
    machine = harness.machine()
    print(f"{len(paths)} schemas, {', '.join(names)}, timeout {args.timeout:g} s", end="")
    print(f", workers {args.workers}")
    started = time.perf_counter()
    cases = run_all(args, tok, paths, names)
    wall = time.perf_counter() - started
    summary = {n: summarize(n, cases, args.timeout) for n in names}
    common = all_compiled(cases, names, args.timeout) if len(names) > 1 else None
    report(summary, common)
    print(f"\n{len(paths)} schemas in {wall:.0f} s")
    return {
        "benchmark": "grammar",
        "machine": dict(machine, loadavg_at_end=os.getloadavg()),
        "args": vars(args),
        "source": source_state(),
        "wall_s": wall,
        "engines": summary,
        "all_compiled": common,
        "schemas": per_schema(cases),
    }


if __name__ == "__main__":
    main()
