"""tgix engine benchmark (issue 3): decode, prefill and start-up against the machine's ceilings and
transformers, all in one run, default model (SmolLM2-135M-Instruct), float32.

    python -m benchmarks.engine [--json results.json]
    python -m benchmarks.engine --batches 1 4 --new-tokens 16 --prefill-lengths 128 \
        --repeats 1 --limit max_batch_size=4 --limit max_total_tokens=512 \
        --limit max_batch_prefill_tokens=512            # a quick shrunk run

In order (each part can be skipped):
 1. Ceilings (benchmarks.roofline): GEMV over the model's weight bytes -> GB/s and the batch-1
    decode ceiling; GEMM at `--gemm-tokens` over the layer matrices -> prefill ceiling.
 2. Start-up (benchmarks.startup in a subprocess, twice, in a fresh TGIX_CACHE): cold (compiles
    every bucket) and warm (loads the serialized executables); launch-to-healthy seconds and
    the runner's compile_seconds.
 3. tgix in this process (LLM with the warm cache): for each batch B, B prompts of
    `--prompt-tokens` random ids submitted at once, greedy, ignore_eos, `--new-tokens` each,
    one stream-reader thread per request stamping every token event. Decode tok/s is the
    steady phase: tokens produced after the first token of the last request, divided by the
    time from then to the last token; step ms is the median gap between a request's
    consecutive tokens in that phase; e2e tok/s is B * N / (submit to last token); gap ms is
    the engine's median host gap between steps (its last 256 steps, read after the runs). One
    untimed 4-token round per batch first; medians over `--repeats`. Prefill tok/s at L
    tokens: L / time to first token of one request (max_new_tokens=1), median of repeats
    (at least 3), one untimed call first.
 4. transformers generate (benchmarks.hf_reference) on the same weights and sizes, with
    torch.set_num_threads(os.cpu_count()).
 5. Ratios and the issue's targets: batch-1 decode >= 80% of the GEMV ceiling, >= 100 tok/s
    at batch 8, >= 200 at batch 32, prefill >= 85% of the GEMM ceiling, warm start < 20 s.

The KV budget is pinned (`--kv-tokens`, default 32768 tokens) so that every start builds the same
executables; other LimitRequest fields with `--limit key=value`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import median, print_table, random_prompt, ratio

REPO = Path(__file__).resolve().parent.parent


def measure_ceilings(gemm_tokens: int, reps: int) -> dict:
    from benchmarks import roofline
    from tgix import load_model

    loaded = load_model()
    out = {"gemv": roofline.gemv_ceiling(loaded, reps=reps)}
    if gemm_tokens:
        out["gemm"] = roofline.gemm_ceiling(loaded, gemm_tokens, reps=max(3, reps // 2))
    roofline.print_ceilings(out["gemv"], out.get("gemm"))
    del loaded
    gc.collect()
    return out


def start_once(cache: str, args) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.startup", "--kv-tokens", str(args.kv_tokens)]
    for item in args.limit:
        cmd += ["--limit", item]
    cmd += ["--launched-at", repr(time.time())]
    proc = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, "TGIX_CACHE": cache}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"start-up run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_startup(cache: str, args) -> dict:
    cold = start_once(cache, args)
    warm = start_once(cache, args)
    rows = [
        [name, r["ready_s"], r["construct_s"], r["compile_s"], r["executables"]]
        for name, r in (("cold", cold), ("warm", warm))
    ]
    header = ["start", "launch->healthy s", "LLM() s", "compile s", "executables"]
    print_table("Start-up (subprocess, fresh TGIX_CACHE)", header, rows)
    return {"cold": cold, "warm": warm}


def decode_run(llm, batch: int, args, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prompts = [random_prompt(rng, args.prompt_tokens) for _ in range(batch)]
    records = harness.run_batch(llm, prompts, args.new_tokens)
    start = records[0].submitted
    t0 = max(r.token_times[0] for r in records)  # every request is decoding from here on
    t_end = max(r.token_times[-1] for r in records)
    after = sum(sum(t > t0 for t in r.token_times) for r in records)
    gaps = [
        b - a
        for r in records
        for a, b in zip(r.token_times, r.token_times[1:], strict=False)
        if a >= t0
    ]
    return {
        "decode_tok_s": after / (t_end - t0) if t_end > t0 else float("nan"),
        "step_ms": 1e3 * median(gaps),
        "e2e_tok_s": batch * args.new_tokens / (t_end - start),
        "ttft_s": median(r.ttft for r in records),
    }


def prefill_run(llm, length: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    [record] = harness.run_batch(llm, [random_prompt(rng, length)], 1)
    return record.ttft


def measure_tgix(args) -> dict:
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    limits = LimitRequest(**harness.parse_limits(args.limit, args.kv_tokens))
    start = time.perf_counter()
    llm = LLM(limits=limits, options=EngineOptions(progress=False))
    construct = time.perf_counter() - start
    out = {"construct_s": construct, "compile_s": llm.engine.runner.executables.compile_seconds}
    out["limits"] = str(llm.engine.limits)
    print(f"tgix LLM() in this process: {construct:.1f} s (compile_all {out['compile_s']:.1f} s)")
    try:
        decode = []
        for batch in args.batches:
            harness.run_batch(llm, [[1000 + i] * args.prompt_tokens for i in range(batch)], 4)
            runs = [decode_run(llm, batch, args, seed=100 * batch + i) for i in range(args.repeats)]
            row = {"batch": batch, "repeats": len(runs)}
            row |= {k: median(r[k] for r in runs) for k in runs[0]}
            row["host_gap_ms"] = llm.engine.stats().get("host_gap_ms_median", float("nan"))
            decode.append(row)
            print(f"tgix batch {batch}: {row['decode_tok_s']:.1f} tok/s decode", flush=True)
        prefill = []
        for length in args.prefill_lengths:
            prefill_run(llm, length, seed=length)
            ttfts = [prefill_run(llm, length, seed=length + 1 + i) for i in range(args.repeats)]
            if len(ttfts) < 3:
                ttfts += [prefill_run(llm, length, seed=length + 9 + i) for i in range(3)]
            ttft = median(ttfts)
            prefill.append({"tokens": length, "tok_s": length / ttft, "ttft_s": ttft})
        out |= {"decode": decode, "prefill": prefill, "stats": llm.engine.stats()}
    finally:
        llm.close()
    return out


def by_key(items: list[dict], key: str) -> dict:
    return {item[key]: item for item in items}


def summarize(res: dict, args) -> None:
    tg = res.get("tgix", {})
    hf = res.get("transformers", {})
    tg_dec, hf_dec = by_key(tg.get("decode", []), "batch"), by_key(hf.get("decode", []), "batch")
    rows = []
    for b in args.batches:
        t, h = tg_dec.get(b, {}), hf_dec.get(b, {})
        nan = float("nan")
        rows.append(
            [
                b,
                t.get("decode_tok_s", nan),
                t.get("e2e_tok_s", nan),
                t.get("step_ms", nan),
                1e3 * t.get("ttft_s", nan),
                t.get("host_gap_ms", nan),
                h.get("decode_tok_s", nan),
                h.get("e2e_tok_s", nan),
                ratio(t.get("decode_tok_s", nan), h.get("decode_tok_s", nan)),
                ratio(t.get("e2e_tok_s", nan), h.get("e2e_tok_s", nan)),
            ]
        )
    header = ["batch", "tgix tok/s", "tgix e2e", "step ms", "TTFT ms", "gap ms", "HF tok/s"]
    header.append("HF e2e")
    print_table(
        f"Decode ({args.prompt_tokens}-token prompts, {args.new_tokens} new tokens; tok/s = "
        "steady decode, e2e = incl. prefill)",
        [*header, "x HF", "x HF e2e"],
        rows,
    )
    tg_pre, hf_pre = (
        by_key(tg.get("prefill", []), "tokens"),
        by_key(hf.get("prefill", []), "tokens"),
    )
    rows = []
    for n in args.prefill_lengths:
        t, h = tg_pre.get(n, {}), hf_pre.get(n, {})
        t_s, h_s = t.get("tok_s", float("nan")), h.get("tok_s", float("nan"))
        rows.append([n, t_s, 1e3 * t.get("ttft_s", float("nan")), h_s, ratio(t_s, h_s)])
    print_table(
        "Prefill (1 request, time to first token)",
        ["tokens", "tgix tok/s", "TTFT ms", "HF tok/s", "x HF"],
        rows,
    )

    targets = []  # [check, value, target, higher is better]
    ceil = res.get("ceilings", {})
    if "gemv" in ceil and 1 in tg_dec:
        c, v = ceil["gemv"]["batch1_tok_s_ceiling"], tg_dec[1]["decode_tok_s"]
        targets.append([f"batch-1 decode / GEMV ceiling ({v:.1f} / {c:.1f} tok/s)", v / c, 0.8, 1])
        seq = ceil["gemv"].get("dependent_tok_s_ceiling")
        if seq:  # information, not the target: the bound a layer-by-layer decoder meets
            chain = f"({v:.1f} / {seq:.1f} tok/s): {v / seq:.3f}"
            print(f"batch-1 decode / sequential GEMV chain {chain}")
    for b, goal in ((8, 100), (32, 200)):
        if b in tg_dec:
            targets.append([f"batch-{b} decode tok/s", tg_dec[b]["decode_tok_s"], goal, 1])
    gemm = ceil.get("gemm")
    if gemm and gemm["tokens"] in tg_pre:
        c, v = gemm["prefill_tok_s_ceiling"], tg_pre[gemm["tokens"]]["tok_s"]
        name = f"prefill {gemm['tokens']} / GEMM ceiling ({v:.0f} / {c:.0f} tok/s)"
        targets.append([name, v / c, 0.85, 1])
    if "startup" in res:
        targets.append(
            ["warm start, launch to healthy s", res["startup"]["warm"]["ready_s"], 20, 0]
        )
    rows = [
        [
            name,
            v,
            f"{'>=' if up else '<'} {goal}",
            "yes" if (v >= goal if up else v < goal) else "NO",
        ]
        for name, v, goal, up in targets
    ]
    if rows:
        print_table("Targets (issue 3)", ["check", "value", "target", "met"], rows)
    res["targets"] = rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefill-lengths", type=int, nargs="*", default=[128, 512, 1024])
    parser.add_argument("--gemm-tokens", type=int, default=512, help="0: skip the GEMM ceiling")
    parser.add_argument("--repeats", type=int, default=3, help="tgix runs per point (median)")
    parser.add_argument("--hf-repeats", type=int, default=1, help="transformers runs per point")
    parser.add_argument("--cache", help="TGIX_CACHE to use (default: a fresh temporary one)")
    parser.add_argument("--skip-ceilings", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--skip-tgix", action="store_true")
    parser.add_argument("--skip-hf", action="store_true")
    harness.add_common_args(parser)
    args = parser.parse_args()

    cache = args.cache or tempfile.mkdtemp(prefix="tgix-bench-cache-")
    os.environ["TGIX_CACHE"] = cache  # this process's engine reuses the start-up's executables
    res: dict = {"machine": harness.machine(), "args": vars(args)}
    print(json.dumps(res["machine"]))
    try:
        if not args.skip_ceilings:
            res["ceilings"] = measure_ceilings(args.gemm_tokens, reps=10)
        if not args.skip_startup:
            res["startup"] = measure_startup(cache, args)
        if not args.skip_tgix:
            res["tgix"] = measure_tgix(args)
            gc.collect()
        if not args.skip_hf:
            from benchmarks import hf_reference

            res["transformers"] = hf_reference.run(
                args.batches,
                args.prompt_tokens,
                args.new_tokens,
                args.prefill_lengths,
                args.hf_repeats,
            )
            print(f"transformers: torch.set_num_threads({res['transformers']['threads']})")
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    summarize(res, args)
    harness.write_json(args.json, res)


if __name__ == "__main__":
    main()
