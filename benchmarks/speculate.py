"""Speculative decoding on the default model, in-process: output tok/s and accepted tokens per
step with `--speculate` off and n-gram drafts of 2, 3 and 5 tokens, on three workloads, at
concurrency 1 and 8; and what a verify step of T tokens costs beside a decode step.

    python -m benchmarks.speculate [--speculate 0 2 3 5 3/2] [--workloads code qa chat]
        [--concurrency 1 8] [--json PATH]
    python -m benchmarks.speculate --verify-cost [--rows 1 2 4 8] [--draft 3 7] [--prompt-tokens 64]

Workloads (greedy, chat template, stop at EOS or max tokens):
  code  the prompt holds a small Python module; the answer rewrites it with one small change
  qa    a ~1,400-token passage of docs/architecture.md (its "Schedule" step as of 80df038,
        frozen in qa_passage.md: a docs edit once changed this workload between two runs);
        the answer quotes the sentences asked for
  chat  open questions; nothing in the prompt to copy
Every engine (one per --speculate value, compiled on demand) is up at once; for each
workload and concurrency each runs it once untimed (its first calls compile), then the
engines run it timed one after another (--repeats times, rotating the order).
Concurrency c submits c requests at once (prompts cycled); tok/s is generated tokens over
the wall time of the run; "per step" is a request's decode tokens per step it was in
(1 + accepted drafts / decode steps); "same" says whether every request's ids equal the
run without speculation; "3/2" is k=3 with n-gram matches of at least 2 tokens (the
default proposer needs 3, or 2 near where it was copying).
--verify-cost times R rows decoding 1 token a step against R rows verifying k+1 (every
draft rejected, so one token a step either way), the limit of rows per verify step lifted:
the median time between a request's tokens, and the engine's step durations.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import machine, median, print_table, ratio, run_requests, write_json
from tgix.engine import speculate
from tgix.engine.factory import EngineOptions, create_engine
from tgix.engine.limits import LimitRequest
from tgix.engine.request import GenerationRequest
from tgix.models import load_model
from tgix.tokenizer import load_tokenizer

CODE = """import csv
from dataclasses import dataclass


@dataclass
class Record:
    name: str
    city: str
    age: int


def parse_line(line: str) -> Record:
    name, city, age = line.strip().split(",")
    return Record(name=name.strip(), city=city.strip(), age=int(age))


def load(path: str) -> list[Record]:
    with open(path) as f:
        return [parse_line(line) for line in f if line.strip()]


def oldest(records: list[Record]) -> Record:
    return max(records, key=lambda r: r.age)


def by_city(records: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(r.city, []).append(r)
    return groups
"""
CODE_EDITS = (
    "Rename the function parse_line to parse_record everywhere.",
    "Rename the class Record to Person everywhere.",
    "Add a docstring to the function oldest.",
)
QA_QUESTIONS = (
    "Quote the sentence that says what happens when the pages run out.",
    "Quote the sentences that describe what the engine commits early in steady decode.",
    "Quote the sentence that says what happens to a step that raises.",
)
CHAT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are three good habits for staying healthy? Explain each briefly.",
    "Describe your ideal weekend in a few sentences.",
)
MAX_NEW = {"code": 256, "qa": 96, "chat": 128}


def passage() -> str:
    return Path(__file__).with_name("qa_passage.md").read_text().strip()


def workload_prompts(tokenizer, name: str) -> list[list[int]]:
    if name == "code":
        texts = [f"{edit} Output the whole file.\n\n```python\n{CODE}```" for edit in CODE_EDITS]
    elif name == "qa":
        texts = [f"{passage()}\n\n{q}" for q in QA_QUESTIONS]
    else:
        texts = list(CHAT)
    out = []
    for text in texts:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        out.append(tokenizer.encode(rendered, add_special_tokens=False))
    return out


def make_engine(k: int, kv_tokens: int, on_step=None):
    """Prefix caching off: the timed run's prompts are the untimed run's, and a cache hit
    would both change the prefill and need shapes the untimed run did not compile."""
    loaded = load_model(None)
    return create_engine(
        loaded,
        load_tokenizer(loaded.files),
        LimitRequest(max_batch_total_tokens=kv_tokens),
        EngineOptions(
            speculate=k, compile=False, progress=False, prewarm=False, prefix_caching=False
        ),
        on_step=on_step,
    )


def run_workload(engine, prompts, max_new: int, concurrency: int) -> dict:
    requests = [
        GenerationRequest(prompt_ids=tuple(prompts[i % len(prompts)]), max_new_tokens=max_new)
        for i in range(max(concurrency, len(prompts)))
    ]
    start = time.perf_counter()
    if concurrency == 1:
        records = [r for req in requests for r in run_requests(engine, [req])]
    else:
        records = run_requests(engine, requests)
    wall = time.perf_counter() - start
    done = [r.completion for r in records]
    tokens = sum(c.generated_tokens for c in done)
    per_step = [
        (c.generated_tokens - 1) / max(1, c.generated_tokens - 1 - c.skipped_tokens) for c in done
    ]
    return {
        "tok_s": tokens / wall,
        "tokens": tokens,
        "wall_s": wall,
        "per_step": float(np.mean(per_step)),
        "ids": [[t.id for t in c.tokens] for c in done],
    }


def timed_run(engine, prompts, max_new: int, concurrency: int, tries: int = 3) -> dict:
    """run_workload, again when the run compiled a shape (the engines compile on demand, and
    a timed run can batch its admissions differently from the untimed one: a compile of a
    large prefill shape inside a run measured 0.55-0.79x)."""
    for attempt in range(tries):
        before = len(engine.runner.executables)  # compiled so far
        r = run_workload(engine, prompts, max_new, concurrency)
        if len(engine.runner.executables) == before:
            return {**r, "compiled_in_run": attempt}
    return {**r, "compiled_in_run": tries}


def compare(args) -> dict:
    """Every engine at once (one per config), so each workload's runs are minutes apart at
    most: the machine's speed drifts between runs (shared cores), and a ratio of runs taken
    far apart measures the drift."""
    results: dict = {}
    engines = {}
    try:
        for config in args.speculate:  # "k" or "k/min_n" (the n-gram's shortest match)
            k, _, min_n = config.partition("/")
            engines[config] = make_engine(int(k), args.kv_tokens)
            if min_n:
                engines[config].proposer = speculate.NgramProposer(min_n=int(min_n))
        for name in args.workloads:
            prompts = workload_prompts(engines[args.speculate[0]].tokenizer, name)
            for c in args.concurrency:
                for engine in engines.values():
                    run_workload(engine, prompts, MAX_NEW[name], c)  # compiles its shapes
                for rep in range(args.repeats):
                    order = args.speculate[rep:] + args.speculate[:rep]
                    for config in order:
                        r = timed_run(engines[config], prompts, MAX_NEW[name], c)
                        results.setdefault((config, name, c), []).append(r)
                        print(f"{config} {name} c={c}: {r['tok_s']:.1f} tok/s, "
                              f"{r['per_step']:.2f}/step")  # fmt: skip
    finally:
        for engine in engines.values():
            engine.shutdown()
    round_ratios = {  # each round ran every config once, minutes apart at most
        (k, name, c): [
            r["tok_s"] / b["tok_s"] for r, b in zip(runs, results[("0", name, c)], strict=True)
        ]
        for (k, name, c), runs in results.items()
        if ("0", name, c) in results
    }
    results = {
        key: {
            **runs[0],
            "tok_s": median(r["tok_s"] for r in runs),
            "runs": len(runs),
            "all_tok_s": [r["tok_s"] for r in runs],
            "round_ratio": median(round_ratios[key]) if key in round_ratios else float("nan"),
        }
        for key, runs in results.items()
    }
    rows = []
    for name in args.workloads:
        for c in args.concurrency:
            base = results.get(("0", name, c))
            for k in args.speculate:
                r = results[(k, name, c)]
                same = "-" if base is None else str(r["ids"] == base["ids"])
                speedup = ratio(r["tok_s"], base["tok_s"]) if base else float("nan")
                rows.append(
                    [name, c, k, r["tok_s"], speedup, r["round_ratio"], r["per_step"],
                     r["tokens"], same]
                )  # fmt: skip
    print_table(
        "Speculative decoding (n-gram drafts), default model. tok/s: median over rounds; vs"
        " off: of the medians; by round: the median of each round's k / off",
        ["workload", "c", "k", "tok/s", "vs off", "by round", "per step", "tokens", "same"],
        rows,
    )
    return {f"{n}/c{c}/k{k}": {**v, "ids": None} for (k, n, c), v in results.items()}


def verify_cost(args) -> dict:
    """Median step seconds for R rows decoding 1 token vs verifying k+1 (drafts rejected)."""
    out: dict = {}
    for k in args.draft:
        speculate.VERIFY_TOKENS["cpu"] = max(args.rows) * (k + 1)  # lift the rule to measure
        steps: dict = collections.defaultdict(list)
        engine = make_engine(k, args.kv_tokens, _recorder(steps))
        rng, history = np.random.default_rng(0), args.prompt_tokens
        engine.proposer = _Rejected(k)
        try:
            for rows in args.rows:
                for drafts in (False, True):
                    engine.proposer = _Rejected(k) if drafts else _NoDrafts()
                    requests = [
                        GenerationRequest(
                            prompt_ids=tuple(rng.integers(1000, 40000, history).tolist()),
                            max_new_tokens=40,
                            ignore_eos=True,
                        )
                        for _ in range(rows)
                    ]
                    for _ in range(2):  # the first run compiles
                        steps.clear()
                        records = run_requests(engine, requests)
                    t = rows * (k + 1) if drafts else rows
                    itl = median(x for r in records for x in r.itls[2:])
                    out[(k, rows, drafts)] = (median(steps[rows, t][3:]), itl)
        finally:
            engine.shutdown()
    table = []
    for k in args.draft:
        for rows in args.rows:
            (decode, decode_itl), (verify, verify_itl) = out[(k, rows, False)], out[(k, rows, True)]
            table.append(
                [k, rows, rows * (k + 1), decode_itl * 1e3, verify_itl * 1e3,
                 verify_itl / decode_itl, decode * 1e3, verify * 1e3]
            )  # fmt: skip
    print_table(
        "Verify step vs decode step: median ms between a request's tokens (one token per row"
        " per step either way), and the engine's step duration (dispatch to read-back;"
        " decode steps overlap the next)",
        ["k", "R", "T verify", "decode itl", "verify itl", "ratio", "decode step", "verify step"],
        table,
    )
    return {f"k{k}/R{r}/{'verify' if d else 'decode'}": v for (k, r, d), v in out.items()}


def _recorder(steps: dict):
    """The engine's step hook: durations by (rows, tokens)."""
    return lambda kind, seconds, rows, tokens, *, ok: steps[rows, tokens].append(seconds)


class _NoDrafts:
    def propose(self, seq, k):
        return ()


class _Rejected:
    """k drafts no model picks here (token ids past the tokenizer's ordinary range)."""

    def __init__(self, k: int):
        self.k = k

    def propose(self, seq, k):
        return tuple(range(3, 3 + k))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculate", nargs="+", default=["0", "2", "3", "5", "3/2"])
    parser.add_argument("--workloads", nargs="+", default=["code", "qa", "chat"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--verify-cost", action="store_true")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--draft", type=int, nargs="+", default=[3, 7])
    parser.add_argument("--prompt-tokens", type=int, default=64, help="--verify-cost's history")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs (rotating order)")
    parser.add_argument("--kv-tokens", type=int, default=16384)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    results = {"machine": machine()}
    results["verify_cost" if args.verify_cost else "speculate"] = (
        verify_cost(args) if args.verify_cost else compare(args)
    )
    write_json(args.json, results)


if __name__ == "__main__":
    main()
