"""Load-time quantization on the default model: float32 against each `--quantize` mode.

    python -m benchmarks.quant [--modes none eetq fp8 awq:float awq:kept awq:int8 ...]
                               [--batches 1 4 16] [--json PATH]

For each mode, one in-process engine (tgix.LLM, KV pinned by --kv-tokens, executables
compiled at start): weight bytes on the device, construction seconds (load + quantize +
compile), perplexity over `--ppl-chunks` runs of `--ppl-tokens` tokens of real text (CPython's
pydoc topics, the prompts of benchmarks.serve_load; prompt logprobs through the engine),
greedy agreement with float32 (first 32 tokens of 4 text prompts), then decode tok/s at each
batch (benchmarks.engine's decode_run: random prompts, ignore_eos) and prefill tok/s. The
engines run one after another, so ratios compare runs minutes apart on a shared machine.

A mode `<format>:<form>` (form float | kept | int8: tgix/models/quant_group.py) serves the
default model's own GGUF file (format gguf: its Q4_1 blocks) or (awq, gptq) a 4-bit
checkpoint of the default model in that format, groups of
--group inputs, written once under $TGIX_CACHE/hf/ by tgix.testing_quant's round-to-nearest
quantizer (not AWQ's or GPTQ's calibrated search, so its perplexity is an upper bound of
theirs) from the float32 folder benchmarks.chat_load writes. A mode `kv:fp8_e4m3fn` (or
`kv:fp8_e5m2`) keeps float32 weights and stores the KV pages in fp8 (--kv-cache-dtype).
"""

from __future__ import annotations

import argparse
import math
import time
from types import SimpleNamespace

import numpy as np

from benchmarks import harness
from benchmarks.engine import decode_run, prefill_run
from benchmarks.harness import median, print_table, write_json
from benchmarks.serve_load import load_prompts


def perplexity(llm, texts: list[str], tokens: int) -> float:
    """exp of the mean negative logprob of every prompt token after the first."""
    logprobs = []
    for text in texts:
        ids = llm.tokenizer.encode(text)[:tokens]
        [done] = llm.generate([ids], max_new_tokens=1, prompt_logprobs=True)
        logprobs += [t.logprob for t in done.prefill[1:]]
    return math.exp(-float(np.mean(logprobs)))


def greedy_ids(llm, texts: list[str], n: int) -> list[list[int]]:
    prompts = [llm.tokenizer.encode(t) for t in texts]
    return [[t.id for t in c.tokens] for c in llm.generate(prompts, max_new_tokens=n)]


def prequantized_folder(fmt: str, group: int):
    """The default model as a 4-bit `fmt` (awq, gptq) checkpoint, written once."""
    import shutil
    import tempfile
    from pathlib import Path

    from benchmarks.chat_load import vllm_folder
    from tgix import testing_quant
    from tgix.tokenizer import cache_root

    target = cache_root() / "hf" / f"SmolLM2-135M-Instruct-{fmt}-g{group}"
    if not (target / "config.json").exists():
        source = vllm_folder()  # (creates $TGIX_CACHE/hf)
        scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        writer = {
            "awq": testing_quant.write_awq_checkpoint,
            "gptq": testing_quant.write_gptq_checkpoint,
        }
        writer[fmt](source, scratch / "q", group=group)
        shutil.rmtree(target, ignore_errors=True)
        (scratch / "q").rename(target)
        shutil.rmtree(scratch)
    return str(target)


def measure(mode: str | None, args) -> dict:
    import os

    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest
    from tgix.serve import KV_DTYPES

    limits = LimitRequest(**harness.parse_limits(args.limit, args.kv_tokens))
    model_id, kv_dtype = None, None
    os.environ.pop("TGIX_QUANT_FORM", None)  # a form is one mode's, not the next one's
    os.environ.pop("TGIX_CPU_KERNELS", None)
    quantize = mode
    if mode is not None and mode.endswith("/xla"):  # without tgix's int8 CPU kernel
        quantize = mode.removesuffix("/xla")
        os.environ["TGIX_CPU_KERNELS"] = "0"
    if quantize is not None and quantize.startswith("kv:"):  # float32 weights, fp8 KV pages
        quantize, kv_dtype = None, KV_DTYPES[quantize[3:]]
    elif quantize is not None and ":" in quantize:
        fmt, form = quantize.split(":")
        model_id = None if fmt == "gguf" else prequantized_folder(fmt, args.group)
        quantize = None
        os.environ["TGIX_QUANT_FORM"] = form
    start = time.perf_counter()
    llm = LLM(
        model_id,
        quantize=quantize,
        limits=limits,
        options=EngineOptions(
            progress=False, prompt_logprobs=True, prefix_caching=False, kv_dtype=kv_dtype
        ),
    )
    out = {"mode": mode or "float32", "construct_s": time.perf_counter() - start}
    try:
        out["weight_mib"] = llm.engine.runner.param_bytes / 2**20
        texts = load_prompts("text", args.ppl_chunks, args.ppl_tokens, seed=7)
        out["ppl"] = perplexity(llm, texts, args.ppl_tokens)
        out["greedy"] = greedy_ids(llm, load_prompts("text", 4, 40, seed=11), 32)
        decode_args = SimpleNamespace(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
        for batch in args.batches:
            harness.run_batch(llm, [[1000 + i] * args.prompt_tokens for i in range(batch)], 4)
            runs = [decode_run(llm, batch, decode_args, seed=100 * batch + i) for i in range(2)]
            out[f"decode_{batch}"] = median(r["decode_tok_s"] for r in runs)
            print(f"{out['mode']} batch {batch}: {out[f'decode_{batch}']:.1f} tok/s", flush=True)
        prefill_run(llm, args.prefill_tokens, seed=1)
        ttft = median(prefill_run(llm, args.prefill_tokens, seed=2 + i) for i in range(3))
        out["prefill_tok_s"] = args.prefill_tokens / ttft
    finally:
        llm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["none", "eetq", "fp8"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--ppl-chunks", type=int, default=8)
    parser.add_argument("--ppl-tokens", type=int, default=256)
    parser.add_argument("--group", type=int, default=64, help="inputs per group (4-bit modes)")
    harness.add_common_args(parser)
    args = parser.parse_args()
    results = [measure(None if m == "none" else m, args) for m in args.modes]
    base = next((r for r in results if r["mode"] == "float32"), results[0])
    header = ["mode", "weights MiB", "start s", "ppl", "ppl vs f32", "same 32 greedy"]
    header += [f"decode B={b}" for b in args.batches] + [f"prefill {args.prefill_tokens}"]
    rows = []
    for r in results:
        same = sum(a == b for a, b in zip(r["greedy"], base["greedy"], strict=True))
        row = [r["mode"], f"{r['weight_mib']:.0f}", f"{r['construct_s']:.0f}", f"{r['ppl']:.3f}"]
        row += [f"{r['ppl'] / base['ppl'] - 1:+.2%}", f"{same}/{len(r['greedy'])}"]
        for b in args.batches:
            value, ratio = r[f"decode_{b}"], r[f"decode_{b}"] / base[f"decode_{b}"]
            row.append(f"{value:.1f} ({ratio:.2f}x)")
        row.append(f"{r['prefill_tok_s']:.0f} ({r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x)")
        rows.append(row)
    print_table("load-time quantization, default model (tok/s, ratio to float32)", header, rows)
    write_json(args.json, {"machine": harness.machine(), "results": results})


if __name__ == "__main__":
    main()
