"""Where a lazily built grammar's first mask goes: schema -> tree, tree -> NFA (LazyDFA's
construction), then the start state's mask, per MaskBench schema, in this process.

One process compiles the schemas one after another, as a server does (what one grammar
leaves in the process-wide caches, e.g. tgix.grammar.lazy_shared.COMMON, the next one
finds), through `GrammarCompiler(lazy=True, workers=0)`, no disk cache. `total` is the
compile call: what `benchmarks.grammar` times as the first mask, less the copy of the mask.

    python -m benchmarks.grammar_first_mask [--every 10] [--timeout 10] [--top 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np

from benchmarks import harness

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "maskbench")


def measure(paths: list[str], timeout_s: float) -> list[dict]:
    from tgix.grammar import GrammarCompiler, GrammarOptions, GrammarSpec
    from tgix.grammar.vocabulary import TokenVocabulary
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model(None))
    vocab = TokenVocabulary.from_tokenizer(tok.hf, eos_ids=tok.eos_token_ids)
    options = GrammarOptions(timeout_s=timeout_s)
    compiler = GrammarCompiler(vocab, options, workers=0, memory_items=0, lazy=True)
    compiler.warm_up()  # the trie and the container automaton, outside any timing
    rows = []
    for path in paths:
        with open(path) as f:
            spec = GrammarSpec.json(json.dumps(json.load(f)["schema"]))
        row = {"file": os.path.basename(path)}
        started = time.perf_counter()
        try:
            index = compiler.compile(spec)
        except Exception as exc:  # a refused schema: kept with its reason
            row.update(total_s=time.perf_counter() - started, error=f"{type(exc).__name__}")
            rows.append(row)
            continue
        row["total_s"] = time.perf_counter() - started
        stats = index.stats if hasattr(index, "stats") else index.base.stats
        row.update(tree_s=stats["tree_s"], nfa_s=stats["nfa_s"])
        row["start_mask_s"] = stats["first_mask_s"] - stats["tree_s"] - stats["nfa_s"]
        rows.append(row)
    return rows


def report(rows: list[dict], top: int) -> dict:
    ok = [r for r in rows if "error" not in r]
    summary = {"schemas": len(rows), "compiled": len(ok)}
    print(f"{len(ok)}/{len(rows)} compiled")
    for key in ("total_s", "tree_s", "nfa_s", "start_mask_s"):
        values = np.array([r[key] for r in ok]) * 1e3
        p50, p90 = np.percentile(values, 50), np.percentile(values, 90)
        summary[key] = {"p50_ms": p50, "p90_ms": p90}
        print(f"{key[:-2]:>11}  p50 {p50:7.1f} ms  p90 {p90:7.1f} ms")
    print("slowest:")
    for r in sorted(ok, key=lambda r: -r["total_s"])[:top]:
        parts = " ".join(f"{k[:-2]} {r[k] * 1e3:.0f}" for k in ("tree_s", "nfa_s", "start_mask_s"))
        print(f"  {r['file']:<56} {r['total_s'] * 1e3:7.0f} ms ({parts})")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT_DATA, help="folder of MaskBench *.json files")
    parser.add_argument("--every", type=int, default=10, help="every k-th schema (sorted)")
    parser.add_argument("--timeout", type=float, default=10.0, help="compile limit per schema")
    parser.add_argument("--top", type=int, default=10, help="slowest schemas listed")
    parser.add_argument("--json", help="results file")
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.data, "*.json")))[:: args.every]
    if not paths:
        raise SystemExit(f"no MaskBench files under {args.data}")
    rows = measure(paths, args.timeout)
    summary = report(rows, args.top)
    if args.json:
        results = {"benchmark": "grammar_first_mask", "machine": harness.machine()}
        harness.write_json(args.json, dict(results, args=vars(args), summary=summary, rows=rows))


if __name__ == "__main__":
    main()
