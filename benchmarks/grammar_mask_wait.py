"""What a lazily built grammar's new-state masks cost the engine: built inline (the step waits
for them) against built on the mask builder's thread (the row sits a step out when its mask
is not ready within the wait budget), with and without building successors ahead.

    python -m benchmarks.grammar_mask_wait [--schemas 12] [--concurrency 1 4]
        [--modes inline 0 5 5-noahead] [--max-new-tokens 48] [--jit] [--json PATH]

Default model (float32), one engine in this process, its wait budget changed between rounds
(`engine.mask_builder.budget_s` / `.ahead`). A round: `c` grammar requests (each a different
MaskBench schema, every k-th file of the sorted folder that compiles lazily, with a
chat-template prompt asking for an instance of it) and `c` unconstrained requests (random
32-token prompts, ignore_eos) submitted together, greedy, --max-new-tokens each, every stream
read in its own thread. Every grammar is compiled fresh for its round (a GrammarCompiler with
no memory or disk cache, lazy_shared.COMMON cleared first): each round's masks are all new,
as for a schema the server has never seen. Modes run in a rotating order per round (the
first of a round is no colder than the others: the cleared caches are the same).

Figures per mode and concurrency (medians over requests; ITL: gaps between a request's
token events, pooled):
- grammar rows: time per output token (TPOT: (last - first token) / (n - 1)), ITL p99;
- unconstrained rows beside them: TPOT, ITL p99 (what a grammar costs the others);
- the engine thread's wait for a mask, per committed grammar token: p50 / p99 / max
  (inline: the whole build; thread: at most the budget);
- held: rows left out of a step for a mask, per grammar token;
- round wall time and every token's finish reason.
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
LIMITS = dict(
    max_batch_size=8,
    max_input_tokens=384,
    max_total_tokens=512,
    max_batch_prefill_tokens=2048,
    max_batch_total_tokens=8192,
)


def parse_mode(mode: str) -> tuple[float | None, bool]:
    """'inline' | '<ms>' | '<ms>-noahead' -> (budget_s, ahead)."""
    if mode == "inline":
        return None, False
    ms, _, rest = mode.partition("-")
    return float(ms) / 1000, rest != "noahead"


def pick_schemas(data: str, count: int, compiler, tokenizer) -> list[tuple[str, dict, list]]:
    """Every k-th MaskBench schema that compiles lazily in time; (name, schema, prompt ids)."""
    from tgix.grammar import GrammarSpec

    paths = sorted(glob.glob(os.path.join(data, "*.json")))
    step = max(1, len(paths) // (3 * count))
    picked = []
    for path in paths[::step]:
        with open(path) as f:
            schema = json.load(f)["schema"]
        try:
            compiler.compile(GrammarSpec.json(json.dumps(schema)))
        except Exception:  # refused or over budget: not this benchmark's subject
            continue
        text = json.dumps(schema)[:600]
        messages = [{"role": "user", "content": f"Reply with one JSON instance of: {text}"}]
        chat = tokenizer.hf.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.hf.encode(chat, add_special_tokens=False)[-300:]
        picked.append((os.path.basename(path), schema, ids))
        if len(picked) == count:
            break
    return picked


def run_round(engine, requests) -> tuple[list[harness.TimedStream], float]:
    start = time.perf_counter()
    records = harness.run_requests(engine, requests)
    return records, time.perf_counter() - start


def tpot(record: harness.TimedStream) -> float | None:
    t = record.token_times
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


def summarize(rounds: list[dict]) -> dict:
    def side(kind: str) -> dict:
        recs = [r for rnd in rounds for r in rnd[kind]]
        tpots = [x for x in map(tpot, recs) if x is not None]
        itls = [g for r in recs for g in r.itls]
        return {
            "tpot_ms": 1e3 * harness.median(tpots),
            "itl_p99_ms": 1e3 * harness.percentile(itls, 99),
            "tokens": sum(len(r.token_times) for r in recs),
            "errors": sum(r.error is not None for r in recs),
        }

    waits = [w for rnd in rounds for w in rnd["waits"]]
    grammar = side("grammar")
    return {
        "grammar": grammar,
        "plain": side("plain"),
        "mask_wait_us": {
            "p50": 1e6 * harness.percentile(waits, 50),
            "p99": 1e6 * harness.percentile(waits, 99),
            "max": 1e6 * max(waits, default=float("nan")),
            "calls": len(waits),
        },
        "held_per_token": sum(r["held"] for r in rounds) / max(1, grammar["tokens"]),
        "wall_s": harness.median(r["wall_s"] for r in rounds),
        "finish": [
            getattr(r.completion, "finish_reason", repr(r.error))
            for rnd in rounds
            for r in rnd["grammar"]
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--schemas", type=int, default=12, help="grammar requests per mode")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--modes", nargs="+", default=["inline", "0", "5", "5-noahead"])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--jit", action="store_true", help="no AOT compile (see above)")
    parser.add_argument("--json", help="results file")
    args = parser.parse_args(argv)

    import tgix
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest
    from tgix.engine.request import GenerationRequest
    from tgix.grammar import GrammarCompiler, GrammarOptions, GrammarSpec
    from tgix.grammar.lazy_shared import COMMON

    started = time.perf_counter()
    # --jit: steps compile on first use (an AOT compile of every bucket takes ~15 min here,
    # once per tgix version: the executables are cached); the warm-up rounds below run every
    # mode at every concurrency first, so most shapes are compiled before the timed rounds
    options = EngineOptions(progress=False, compile=not args.jit)
    llm = tgix.LLM(limits=LimitRequest(**LIMITS), options=options)
    engine = llm.engine
    print(f"engine ready in {time.perf_counter() - started:.0f} s", flush=True)
    options = GrammarOptions(timeout_s=10)
    vocab = engine.grammar_compiler.vocab
    compiler = GrammarCompiler(vocab, options, workers=0, memory_items=0, lazy=True)
    compiler.warm_up()
    wanted = max(args.schemas, max(args.concurrency))
    schemas = pick_schemas(args.data, wanted, compiler, llm.tokenizer)
    print(f"{len(schemas)} schemas", flush=True)
    rng = np.random.default_rng(0)
    masks = engine.mask_builder
    results: dict = {"machine": harness.machine(), "args": vars(args), "runs": {}}

    def one_round(mode: str, group, c: int) -> dict:
        COMMON.clear()
        grammars = [compiler.compile(GrammarSpec.json(json.dumps(s))) for _, s, _ in group]
        requests = [
            GenerationRequest(prompt_ids=tuple(ids), max_new_tokens=args.max_new_tokens, grammar=g)
            for (_, _, ids), g in zip(group, grammars, strict=True)
        ] + [
            GenerationRequest(
                prompt_ids=tuple(harness.random_prompt(rng, 32)),
                max_new_tokens=args.max_new_tokens,
                ignore_eos=True,
            )
            for _ in range(c)
        ]
        masks.budget_s, masks.ahead = parse_mode(mode)
        masks.waited_s.clear()
        held = masks.held
        records, wall = run_round(engine, requests)
        return {
            "grammar": records[:c],
            "plain": records[c:],
            "waits": list(masks.waited_s),
            "held": masks.held - held,
            "wall_s": wall,
        }

    for c in args.concurrency:  # untimed: the step shapes each mode and batch size meet
        for mode in args.modes:
            one_round(mode, schemas[:c], c)
    print("warmed up", flush=True)
    for c in args.concurrency:
        per_mode: dict[str, list[dict]] = {m: [] for m in args.modes}
        groups = [schemas[i : i + c] for i in range(0, args.schemas - c + 1, c)]
        for k, group in enumerate(groups):
            order = args.modes[k % len(args.modes) :] + args.modes[: k % len(args.modes)]
            for mode in order:
                per_mode[mode].append(one_round(mode, group, c))
        summary = {m: summarize(r) for m, r in per_mode.items()}
        results["runs"][str(c)] = summary
        print(f"\nconcurrency {c} ({len(groups)} rounds per mode)")
        header = (
            "mode",
            "grammar TPOT ms",
            "grammar ITL p99",
            "plain TPOT ms",
            "plain ITL p99",
            "mask wait p50/p99/max us",
            "held/token",
        )
        rows = [
            (
                m,
                f"{s['grammar']['tpot_ms']:.1f}",
                f"{s['grammar']['itl_p99_ms']:.1f}",
                f"{s['plain']['tpot_ms']:.1f}",
                f"{s['plain']['itl_p99_ms']:.1f}",
                "{p50:.0f} / {p99:.0f} / {max:.0f}".format(**s["mask_wait_us"]),
                f"{s['held_per_token']:.3f}",
            )
            for m, s in summary.items()
        ]
        harness.print_table(f"mask wait, concurrency {c}", header, rows)
    engine.shutdown()
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
