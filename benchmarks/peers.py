"""Serving peers side by side in one run: tgix, llama.cpp's `llama-server` and transformers
`generate`, on the default model (SmolLM2-135M-Instruct: tgix float32 from the GGUF, llama.cpp
on the same GGUF file, transformers float32 from it), plus the machine's roofline.

    python -m benchmarks.llama_cpp build        # once (about 15 minutes on 2 cores)
    python -m benchmarks.peers [--concurrency 1 4 8 16 32 64] [--new-tokens 32]
        [--prompt-words 64] [--requests 8] [--rounds 3] [--settle 30] [--repeats 1]
        [--no-llama-cpp] [--no-hf] [--tgix-quantize eetq ...]
        [--vllm-python VENV/bin/python] [--ort-python VENV/bin/python]

In order, each engine alone on the machine:
 1. Roofline (benchmarks.roofline): float32 GEMV GB/s over the model's weights (the batch-1
    decode ceiling) and GEMM GFLOP/s (the prefill ceiling).
 2. For each repeat, tgix (`python -m tgix.serve`, KV budget pinned, warm executable cache
    after the first start; then once per `--tgix-quantize` mode, with `--quantize` that mode)
    then `llama-server --parallel 64` (continuous batching, 512 tokens
    per slot, all cores): the closed-loop sweep of benchmarks.serve_load over both prompt
    sets (synthetic words and real text), OpenAI `/v1/completions` streamed, greedy,
    `ignore_eos`, `--new-tokens` each; at each concurrency C, max(--requests, --rounds x C)
    requests (3 per client by default: one arrival burst is not the whole level; 512
    distinct prompts per set, so no prompt repeats and llama-server's prompt cache never
    hits). Each server is left idle for `--settle` seconds after /health answers before the
    sweep: a deployed server is up before its traffic comes, and tgix runs each cheap step
    shape once while idle (its first call on XLA:CPU is 0.1-0.3 s slower: prewarm.py; 60
    shapes took 17-19 s on 2026-12-06, hence 30 s; llama-server warms up before it answers
    /health). Each server is stopped (its whole process group) before the next starts.
 3. With `--vllm-python`, vLLM's CPU build (float32) through the same sweep; with
    `--ort-python`, ONNX Runtime GenAI's int4 model in-process on static batches as in 4
    (benchmarks/peer_engines.py: their venvs, the conversion, the settings).
 4. transformers `generate` on static batches of the synthetic prompts (tokenized, cut to the
    shortest so the batch needs no padding), batch = concurrency: output tok/s = B N / t(N),
    TTFT = t(1) (the whole batch's prefill), TPOT = (t(N) - t(1)) / (N - 1).
Per engine, prompt set and concurrency the medians over repeats of output tokens/s, TTFT p50
and TPOT p50; the ratio table tgix / peer; tgix at concurrency 1 as a share of the GEMV
ceiling (1 / TPOT p50 against it). JSON in benchmarks/results/peers.json, the plot in
peers.png. Nothing is left running: servers are killed in `finally`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import time

from benchmarks import peer_engines, serve_load
from benchmarks.harness import median, print_table, wait_healthy, write_json

KV_TOKENS = 32768
ORT = "onnxruntime-genai int4 (in-process)"
PEERS = ("llama.cpp", "vLLM", ORT, "transformers")  # in the tables' order
METRICS = ("output_token_throughput", "ttft_p50", "tpot_p50", "e2e_p50")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tgix(
    port: int, log_path: str, quantize: str | None = None, timeout_s: float = 1200
) -> subprocess.Popen:
    args = [sys.executable, "-m", "tgix.serve", "--port", str(port),
            "--max-batch-total-tokens", str(KV_TOKENS), "--max-batch-size", "64"]  # fmt: skip
    if quantize:
        args += ["--quantize", quantize]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_healthy(port, proc, timeout_s=timeout_s)  # a cold start compiles for minutes
    return proc


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (its whole process group when it leads one: tgix's grammar
    workers), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    own_group = os.getpgid(proc.pid) == proc.pid

    def send(sig) -> None:
        os.killpg(proc.pid, sig) if own_group else proc.send_signal(sig)

    try:
        send(signal.SIGTERM)
        proc.wait(60)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(10)


def roofline() -> dict:
    from benchmarks.roofline import gemm_ceiling, gemv_ceiling
    from tgix.models import load_model

    loaded = load_model(None)
    out = {"gemv": gemv_ceiling(loaded), "gemm": gemm_ceiling(loaded)}
    del loaded
    gc.collect()
    return out


def sweep_server(port: int, prompt_sets: dict, args) -> dict:
    url = f"http://127.0.0.1:{port}"
    return {
        name: asyncio.run(
            serve_load.sweep(
                url,
                "openai",
                prompts,
                args.concurrency,
                args.new_tokens,
                requests_per_level=args.requests,
                rounds=args.rounds,
                time_limit_s=args.time_limit,
            )
        )
        for name, prompts in prompt_sets.items()
    }


def hf_static(prompts: list[str], levels, new_tokens: int) -> list[dict]:
    from benchmarks.hf_reference import load_reference, time_generate
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    model = load_reference()
    tokenizer = load_tokenizer(resolve_model(None))
    ids = [tokenizer.encode(p) for p in prompts]
    shortest = min(len(i) for i in ids)
    out = []
    for batch in levels:
        rows = [ids[i % len(ids)][:shortest] for i in range(batch)]
        time_generate(model, rows, 2)  # warm-up allocation
        t_one = time_generate(model, rows, 1)
        t_all = time_generate(model, rows, new_tokens)
        out.append({
            "concurrency": batch,
            "output_token_throughput": batch * new_tokens / t_all,
            "ttft_p50": t_one,
            "tpot_p50": (t_all - t_one) / (new_tokens - 1),
            "e2e_p50": t_all,
        })  # fmt: skip
        print(f"  transformers batch {batch}: {out[-1]['output_token_throughput']:.1f} tok/s",
              file=sys.stderr, flush=True)  # fmt: skip
    return out


def medians(runs: list[list[dict]]) -> list[dict]:
    """Per concurrency level, the median of each metric over repeated sweeps."""
    merged = []
    for level in zip(*runs, strict=True):
        row = {"concurrency": level[0]["concurrency"], "repeats": len(level)}
        row.update({m: median(r[m] for r in level) for m in METRICS})
        merged.append(row)
    return merged


def quantized_checks(engine: str, results: dict, name: str, checks: dict) -> None:
    """A quantized tgix against tgix float32 and each serving peer (issue 17's targets)."""
    ours, base = results[engine][name], results["tgix"][name]
    peers = {p: results[p][name] for p in PEERS if name in results.get(p, {})}
    header = ["concurrency", f"{engine} tok/s", "vs tgix float32", "TTFT p50 s"]
    header += [f"vs {p}" for p in peers]
    rows, vs_float, vs_peer = [], {}, {p: {} for p in peers}
    for i, r in enumerate(ours):
        c, rate = r["concurrency"], r["output_token_throughput"]
        vs_float[c] = rate / base[i]["output_token_throughput"]
        row = [c, rate, vs_float[c], r["ttft_p50"]]
        for p, theirs in peers.items():
            vs_peer[p][c] = rate / theirs[i]["output_token_throughput"]
            row.append(vs_peer[p][c])
        rows.append(row)
    print_table(f"{name} prompts: {engine}", header, rows)
    if 1 in vs_float:
        checks[f"{name}: {engine} >= 1.8x float32 at 1 ({vs_float[1]:.2f}x)"] = vs_float[1] >= 1.8
    worst = min(vs_float.values())
    checks[f"{name}: {engine} no level slower than float32 (worst {worst:.2f}x)"] = worst >= 1
    for p, ratio in vs_peer.items():
        worst = min(ratio.values())
        checks[f"{name}: {engine} ahead of {p} everywhere (worst {worst:.2f}x)"] = worst > 1


def report(results: dict, ceilings: dict, args) -> dict:
    """Ratio tables per prompt set and the issue's targets."""
    checks = {}
    for name in results["tgix"]:
        for engine in (e for e in results if e.startswith("tgix --quantize")):
            quantized_checks(engine, results, name, checks)
        ours = results["tgix"][name]
        peers = {p: results[p][name] for p in PEERS if name in results.get(p, {})}
        header = ["concurrency", "tgix tok/s", "tgix TTFT p50 s"]
        for p in peers:
            header += [f"{p} tok/s", f"tgix/{p}", f"{p} TTFT p50 s"]
        rows = []
        for i, r in enumerate(ours):
            row = [r["concurrency"], r["output_token_throughput"], r["ttft_p50"]]
            for p in peers.values():
                rate = p[i]["output_token_throughput"]
                row += [rate, r["output_token_throughput"] / rate, p[i]["ttft_p50"]]
            rows.append(row)
        print_table(f"{name} prompts: medians of {args.repeats} run(s)", header, rows)
        by_level = {r["concurrency"]: r for r in ours}
        if "llama.cpp" in peers:
            lc = {r["concurrency"]: r["output_token_throughput"] for r in peers["llama.cpp"]}
            ratio = {c: r["output_token_throughput"] / lc[c] for c, r in by_level.items()}
            checks[f"{name}: ahead of llama.cpp at every concurrency >= 4"] = all(
                ratio[c] > 1 for c in ratio if c >= 4
            )
            if 32 in ratio:
                checks[f"{name}: >= 2x llama.cpp at 32 ({ratio[32]:.2f}x)"] = ratio[32] >= 2
        if 8 in by_level:
            ttft = by_level[8]["ttft_p50"]
            checks[f"{name}: TTFT p50 < 1 s at 8 ({ttft:.2f} s)"] = ttft < 1
        if "transformers" in peers:
            hf = {r["concurrency"]: r["output_token_throughput"] for r in peers["transformers"]}
            worst = min(by_level[c]["output_token_throughput"] / hf[c] for c in hf)
            checks[f"{name}: >= 3x transformers at every batch (worst {worst:.2f}x)"] = worst >= 3
    if 1 in {r["concurrency"] for r in results["tgix"]["synthetic"]}:
        single = next(r for r in results["tgix"]["synthetic"] if r["concurrency"] == 1)
        share = (1 / single["tpot_p50"]) / ceilings["gemv"]["batch1_tok_s_ceiling"]
        checks[f"concurrency 1 decode >= 80% of the GEMV ceiling ({100 * share:.0f}%)"] = (
            share >= 0.8
        )
        seq = ceilings["gemv"].get("dependent_tok_s_ceiling")
        if seq:
            share_seq = (1 / single["tpot_p50"]) / seq
            print(f"concurrency 1 decode / sequential GEMV chain: {share_seq:.2f}")
    print("\ntargets:")
    for check, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {check}")
    return checks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=512, help="distinct prompts per set")
    parser.add_argument(
        "--requests", type=int, default=8, help="per level: max(this, rounds x level)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="requests per client per level, at least"
    )
    parser.add_argument("--time-limit", type=float, default=90, help="seconds per level")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--settle", type=float, default=30, help="idle seconds after /health, every server"
    )
    parser.add_argument(
        "--tgix-quantize", nargs="*", default=[], help="also serve tgix with each --quantize"
    )
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--vllm-python", help="vLLM's CPU build: its venv's python")
    parser.add_argument("--vllm-kv-gib", type=int, default=2)
    parser.add_argument("--ort-python", help="ONNX Runtime GenAI: its venv's python")
    parser.add_argument("--json", default="benchmarks/results/peers.json")
    parser.add_argument("--plot", default="benchmarks/results/peers.png")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    log_path = os.path.splitext(args.json)[0] + ".log"
    started = time.perf_counter()
    ceilings = roofline()
    prompt_sets = {
        kind: serve_load.load_prompts(kind, args.prompts, args.prompt_words)
        for kind in ("synthetic", "text")
    }
    variants = {"tgix": None, **{f"tgix --quantize {q}": q for q in args.tgix_quantize}}
    runs: dict[str, list[dict]] = {**{v: [] for v in variants}, "llama.cpp": [], "vLLM": []}

    def settle_and_sweep(proc: subprocess.Popen, port: int) -> dict:
        try:
            time.sleep(args.settle)
            return sweep_server(port, prompt_sets, args)
        finally:
            stop(proc)

    for _ in range(args.repeats):
        for variant, quantize in variants.items():
            port = free_port()
            proc = start_tgix(port, log_path, quantize)
            runs[variant].append(settle_and_sweep(proc, port))
        if not args.no_llama_cpp:
            from benchmarks import llama_cpp
            from tgix.models.hub import default_model_file

            port = free_port()
            proc = llama_cpp.launch(
                default_model_file(), port=port, parallel=max(args.concurrency),
                log_path=log_path,
            )  # fmt: skip
            runs["llama.cpp"].append(settle_and_sweep(proc, port))
        if args.vllm_python:
            port = free_port()
            proc = peer_engines.start_vllm(
                args.vllm_python, port, log_path,
                max_seqs=max(args.concurrency), kv_gib=args.vllm_kv_gib,
            )  # fmt: skip
            runs["vLLM"].append(settle_and_sweep(proc, port))
    results = {
        engine: {name: medians([r[name] for r in sweeps]) for name in prompt_sets}
        for engine, sweeps in runs.items()
        if sweeps
    }
    results.setdefault("llama.cpp", {})
    results[ORT] = {}
    if args.ort_python:
        results[ORT]["synthetic"] = peer_engines.ort_static(
            args.ort_python, prompt_sets["synthetic"], args.concurrency, args.new_tokens
        )
    results["transformers"] = {}
    if not args.no_hf:
        results["transformers"]["synthetic"] = hf_static(
            prompt_sets["synthetic"], args.concurrency, args.new_tokens
        )
    checks = report(results, ceilings, args)
    elapsed = time.perf_counter() - started
    print(f"\nrun time {elapsed / 60:.1f} min")
    write_json(args.json, {
        "args": vars(args), "roofline": ceilings, "results": results, "raw": runs,
        "targets": checks, "run_s": elapsed,
    })  # fmt: skip
    serve_load.plot(
        {f"{e}/{n}": rows for e, sets in results.items() for n, rows in sets.items()}, args.plot
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
