"""JSON Schema coverage on MaskBench-style data: which schemas convert and compile to a DFA,
and whether the DFA accepts the valid instances and rejects the invalid ones.

Data: a folder of `{description, meta, schema, tests: [{valid, data}]}` files (default
/work/shared/data/maskbench). An instance is serialized the way a model would have to write
it: `json.dumps` layouts (`, ` / `: ` and compact), with object keys in whatever order the
grammar allows, found by a depth-first search over key orders that walks the DFA (the grammar
fixes declared properties in schema order, additional ones after them). "Invalid accepted"
means some key order of the invalid instance is accepted: a real invalidation error.

    python -m benchmarks.grammar_coverage [--limit N] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import multiprocessing
import os
import re
import signal
import time

from tgix.grammar import json_arrays, json_strings, pushdown
from tgix.grammar.automaton import DEAD, build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_schema import schema_to_tree
from tgix.grammar.options import GrammarOptions

_SEARCH_BUDGET = 20_000


class _Machine:
    """The DFA, or the DFA with its run-time stack (tgix.grammar.pushdown) when it has one:
    states are then sets of configurations, DEAD the empty set."""

    def __init__(self, dfa):
        self.dfa, self.nesting = dfa, None
        self.start = dfa.start
        if pushdown.has_nesting(dfa):
            self.dfa, self.nesting = pushdown.combine(dfa, _SETTINGS["options"])
            self.start = frozenset({(0, ())})

    def walk(self, data: bytes, state):
        if self.nesting is None:
            return self.dfa.walk(data, state)
        return pushdown.walk(self.dfa.table, self.nesting, state, data) or DEAD

    def accepting(self, state) -> bool:
        if self.nesting is None:
            return bool(self.dfa.accepting[state])
        return any(not stack and self.dfa.accepting[q] for q, stack in state)


class _Walker:
    """Serializes a JSON value through the DFA, choosing object key orders it accepts."""

    def __init__(self, machine: _Machine, item_sep: str, key_sep: str):
        self.dfa = machine
        self.item_sep, self.key_sep = item_sep, key_sep
        self.budget = _SEARCH_BUDGET

    def step(self, state, text: str):
        return self.dfa.walk(text.encode(), state) if state != DEAD else DEAD

    def value(self, v, state: int):
        """End states reachable by writing v from `state` (each a generator item)."""
        self.budget -= 1
        if self.budget < 0 or state == DEAD:
            return
        if isinstance(v, dict):
            yield from self.members(list(v.items()), self.step(state, "{"), True)
        elif isinstance(v, list):
            yield from self.items(v, self.step(state, "["), True)
        else:
            end = self.step(state, json.dumps(v, ensure_ascii=False))
            if end != DEAD:
                yield end

    def items(self, rest: list, state: int, first: bool):
        if state == DEAD:
            return
        if not rest:
            end = self.step(state, "]")
            if end != DEAD:
                yield end
            return
        start = state if first else self.step(state, self.item_sep)
        for mid in self.value(rest[0], start):
            yield from self.items(rest[1:], mid, False)

    def members(self, rest: list, state: int, first: bool):
        if state == DEAD:
            return
        if not rest:
            end = self.step(state, "}")
            if end != DEAD:
                yield end
            return
        for i, (k, v) in enumerate(rest):
            key = (self.item_sep if not first else "") + json.dumps(k, ensure_ascii=False)
            after_key = self.step(state, key + self.key_sep)
            if after_key == DEAD:
                continue
            for mid in self.value(v, after_key):
                yield from self.members(rest[:i] + rest[i + 1 :], mid, False)

    def accepts(self, v) -> bool:
        return any(self.dfa.accepting(s) for s in self.value(v, self.dfa.start))


def _accepts(dfa, data) -> bool:
    machine = _Machine(dfa)
    return any(_Walker(machine, i, k).accepts(data) for i, k in ((", ", ": "), (",", ":")))


def _reason(message: str) -> str:
    message = re.sub(r"'[^']*'", "'…'", message) if "keyword" not in message else message
    return re.sub(r"\d+", "N", message)[:90]


def _alarm(signum, frame):
    raise TimeoutError


_SETTINGS = {"options": GrammarOptions()}  # set by main() before the workers fork


def run_one(path: str, limit_s: int = 60) -> dict:
    """One schema: conversion, DFA, then every test instance; `limit_s` bounds the whole."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    out = {"file": os.path.basename(path), "valid": 0, "invalid": 0}
    t0 = time.monotonic()
    try:
        return _run_one(path, out)
    except TimeoutError:
        out["error"], out["stage"] = f"timeout after {limit_s}s", "timeout"
        return out
    finally:
        signal.alarm(0)
        out["total_s"] = time.monotonic() - t0


def _run_one(path: str, out: dict) -> dict:
    with open(path) as f:
        item = json.load(f)
    options = _SETTINGS["options"]
    t0 = time.monotonic()
    try:
        tree, notes = schema_to_tree(item["schema"], options)
        out["tree_s"] = time.monotonic() - t0
        dfa = build_dfa(tree, options.max_states, time.monotonic() + options.timeout_s)
    except GrammarError as e:
        out["error"] = str(e)
        out["stage"] = "tree" if "tree_s" not in out else "dfa"
        return out
    except RecursionError:
        out["error"], out["stage"] = "RecursionError", "tree"
        return out
    out["dfa_s"] = time.monotonic() - t0 - out["tree_s"]
    out["states"] = dfa.num_states
    out["notes"] = notes
    out["valid_rejected"], out["invalid_accepted"] = [], []
    for n, test in enumerate(item.get("tests", [])):
        accepted = _accepts(dfa, test["data"])
        if test["valid"]:
            out["valid"] += 1
            if not accepted:
                out["valid_rejected"].append(n)
        else:
            out["invalid"] += 1
            if accepted:
                out["invalid_accepted"].append(n)
    return out


def main() -> None:
    defaults = GrammarOptions()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/work/shared/data/maskbench")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write per-schema results here")
    parser.add_argument("--match", default="", help="only files whose name contains this")
    parser.add_argument("--files", help="a JSON list of file names to run (from a --json run)")
    parser.add_argument("--any-value-depth", type=int, default=defaults.any_value_depth)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--max-states", type=int, default=defaults.max_states)
    parser.add_argument("--length-cap", type=int, default=json_strings.LENGTH_CAP)
    parser.add_argument("--items-cap", type=int, default=json_arrays.ITEMS_CAP)
    args = parser.parse_args()
    json_strings.LENGTH_CAP, json_arrays.ITEMS_CAP = args.length_cap, args.items_cap
    _SETTINGS["options"] = GrammarOptions(
        strict=args.strict, any_value_depth=args.any_value_depth, max_states=args.max_states
    )
    files = sorted(f for f in glob.glob(os.path.join(args.data, "*.json")) if args.match in f)
    if args.files:
        with open(args.files) as f:
            wanted = set(json.load(f))
        files = [f for f in files if os.path.basename(f) in wanted]
    if args.limit:
        files = files[: args.limit]
    with multiprocessing.Pool(args.jobs, maxtasksperchild=20) as pool:
        results = pool.map(run_one, files, chunksize=4)
    compiled = [r for r in results if "error" not in r]
    reasons = collections.Counter(
        f"{r['stage']}: {_reason(r['error'])}" for r in results if "error" in r
    )
    valid = sum(r["valid"] for r in compiled)
    invalid = sum(r["invalid"] for r in compiled)
    valid_rejected = sum(len(r["valid_rejected"]) for r in compiled)
    invalid_accepted = sum(len(r["invalid_accepted"]) for r in compiled)
    times = sorted(r["tree_s"] + r["dfa_s"] for r in compiled)
    states = sorted(r["states"] for r in compiled)
    print(f"schemas {len(results)}  compiled {len(compiled)} ({len(compiled) / len(results):.1%})")
    if compiled:
        print(
            f"compile s p50 {times[len(times) // 2]:.3f} p90 {times[int(len(times) * 0.9)]:.3f}"
            f"  states p50 {states[len(states) // 2]} p90 {states[int(len(states) * 0.9)]}"
        )
    print(
        f"valid instances {valid}: rejected {valid_rejected} ({valid_rejected / max(valid, 1):.2%})"
        f"   invalid instances {invalid}: accepted {invalid_accepted}"
    )
    for r in compiled:
        if r["invalid_accepted"]:
            print("  invalid accepted:", r["file"], r["invalid_accepted"])
    for r in compiled:
        if r["valid_rejected"]:
            print("  valid rejected:", r["file"], r["valid_rejected"])
    print("errors:")
    for reason, count in reasons.most_common(40):
        print(f"  {count:5d}  {reason}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
