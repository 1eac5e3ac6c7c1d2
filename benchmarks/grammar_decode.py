"""`python -m benchmarks.grammar --decode`: what a grammar costs a batch-8 decode step on the
real engine (default model, float32), against the same batch without one.

Each round submits 8 requests at once (32 random-token prompts, greedy, 64 new tokens) and
reads every stream in its own thread (`benchmarks.harness`). Without grammar the requests set
`ignore_eos`; with one they carry a compiled `[a-zA-Z ,.]{1,400}` index (EOS only where the
text may end, so ignore_eos would be meaningless) and must still run to length: 64 tokens of
letters stay far below 400 characters and the raw random-token prompt makes `<|im_end|>`
unlikely; every completion's finish reason is checked and reported. The automaton advances
through a new state at nearly every token, so the host's per-token advance is a cache miss as
in real JSON decoding. Figures (as `benchmarks.engine`): decode tok/s in the steady phase
(after the first token of the last request) and token gap ms (median gap between a request's
consecutive tokens there); from the engine's step hook, over its full batch-8 decode steps:
step period ms (median time between consecutive steps' results) and step busy ms (median
dispatch-to-result time; without grammar the engine dispatches the next step before reading
the last, so busy includes queueing behind it; grammar rows wait for the host advance, so
period - busy is the host time between steps). Median of `--repeats` rounds per mode, modes
interleaved (load drifts hit both), one untimed round of each first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks import harness

BATCH, NEW_TOKENS, PROMPT_TOKENS = 8, 64, 32
REGEX = "[a-zA-Z ,.]{1,400}"


def run_round(engine, prompts, grammar, steps: list) -> dict:
    """One batch of requests; steady-phase figures, the engine's decode step times (`steps`,
    filled by its step hook) and the finish reasons."""
    from tgix.engine.request import GenerationRequest

    requests = [
        GenerationRequest(
            prompt_ids=tuple(p),
            max_new_tokens=NEW_TOKENS,
            ignore_eos=grammar is None,
            grammar=grammar,
        )
        for p in prompts
    ]
    steps.clear()
    records = harness.run_requests(engine, requests)
    for r in records:
        if r.error is not None:
            raise RuntimeError(f"request failed: {r.error!r}") from r.error
    t0 = max(r.token_times[0] for r in records)
    t_end = max(r.token_times[-1] for r in records)
    after = sum(sum(t > t0 for t in r.token_times) for r in records)
    gaps = [
        b - a
        for r in records
        for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        if a >= t0
    ]
    full = [(t, d) for kind, t, d, rows in list(steps) if kind == "decode" and rows == BATCH]
    periods = [b[0] - a[0] for a, b in zip(full, full[1:], strict=False)]
    return {
        "decode_tok_s": after / (t_end - t0) if t_end > t0 else float("nan"),
        "step_ms": 1e3 * harness.median(gaps),
        "engine_period_ms": 1e3 * harness.median(periods),
        "engine_busy_ms": 1e3 * harness.median(d for _, d in full),
        "tokens": sum(len(r.token_times) for r in records),
        "finish": [r.completion.finish_reason for r in records],
        "texts": [r.completion.generated_text for r in records],
    }


def run_decode(args) -> dict:
    from tgix.engine.factory import EngineOptions, create_engine
    from tgix.engine.limits import LimitRequest
    from tgix.grammar import GrammarSpec
    from tgix.models import load_model
    from tgix.tokenizer import load_tokenizer

    cache = tempfile.mkdtemp(prefix="tgix-bench-cache-")
    os.environ["TGIX_CACHE"] = cache  # a fresh cache: no stale executables (see README)
    steps: list[tuple[str, float, float, int]] = []

    def on_step(kind, duration_s, batch_size, num_tokens, *, ok):
        steps.append((kind, time.perf_counter(), duration_s, batch_size))

    try:
        limits = LimitRequest(**harness.parse_limits([], harness.DEFAULT_KV_TOKENS))
        machine = harness.machine()
        started = time.perf_counter()
        loaded = load_model(None)
        tokenizer = load_tokenizer(loaded.files)
        options = EngineOptions(progress=False)
        engine = create_engine(loaded, tokenizer, limits, options, on_step=on_step)
        print(f"engine ready in {time.perf_counter() - started:.0f} s")
        t = time.perf_counter()
        index = engine.grammar_compiler.compile(GrammarSpec.regex(REGEX))
        compile_s = time.perf_counter() - t
        rng = np.random.default_rng(0)
        runs: dict[str, list[dict]] = {"none": [], "grammar": []}
        for i in range(1 + args.repeats):  # round 0 is the untimed warm-up of each mode
            for mode, grammar in (("none", None), ("grammar", index)):
                prompts = [harness.random_prompt(rng, PROMPT_TOKENS) for _ in range(BATCH)]
                result = run_round(engine, prompts, grammar, steps)
                if i:
                    runs[mode].append(result)
        with contextlib.suppress(Exception):  # the figures are taken already
            engine.shutdown()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return summarize(runs, compile_s, index.stats, machine)


def summarize(runs: dict[str, list[dict]], compile_s: float, stats: dict, machine: dict) -> dict:
    """Medians per mode, the ratio, the table; the JSON record."""
    keys = ("decode_tok_s", "step_ms", "engine_period_ms", "engine_busy_ms")
    med = {m: {k: harness.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()}
    ratio = harness.ratio(med["grammar"]["decode_tok_s"], med["none"]["decode_tok_s"])
    finish = [f for r in runs["grammar"] for f in r["finish"]]
    rows = [
        [mode, m["decode_tok_s"], m["step_ms"], m["engine_period_ms"], m["engine_busy_ms"]]
        for mode, m in med.items()
    ]
    title = f"Batch-{BATCH} decode, {NEW_TOKENS} new tokens, median of {len(runs['none'])}"
    harness.print_table(
        title, ["grammar", "decode tok/s", "token gap ms", "step period ms", "step busy ms"], rows
    )
    pairs = [
        g["decode_tok_s"] / n["decode_tok_s"]
        for n, g in zip(runs["none"], runs["grammar"], strict=True)
    ]
    print(f"\ngrammar / none decode tok/s: {ratio:.3f} (target >= 0.95)")
    print(f"per round (adjacent runs): {' '.join(f'{p:.3f}' for p in pairs)}")
    early = len(finish) - finish.count("length")
    print(f"grammar requests ending before {NEW_TOKENS} tokens: {early} of {len(finish)}")
    print(f"sample constrained output: {runs['grammar'][0]['texts'][0][:120]!r}")
    return {
        "benchmark": "grammar_decode",
        "machine": machine,
        "batch": BATCH,
        "new_tokens": NEW_TOKENS,
        "regex": REGEX,
        "grammar_compile_s": compile_s,
        "grammar_stats": stats,
        "median": med,
        "ratio_tok_s": ratio,
        "ratio_per_round": pairs,
        "loadavg_at_end": os.getloadavg(),
        "grammar_early_finishes": early,
        "runs": {m: [_without_texts(r) for r in rs] for m, rs in runs.items()},
    }


def _without_texts(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "texts"}
