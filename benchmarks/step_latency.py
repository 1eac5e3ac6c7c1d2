"""Step latency, as TGI's `text-generation-benchmark` measures it: the engine's own steps driven
directly (no HTTP, no scheduler), per batch size.

    python -m benchmarks.step_latency [--batch-size 1 2 4 8 16 32] [--sequence-length 10]
        [--decode-length 8] [--runs 10] [--warmups 1] [--model-id PATH] [--json PATH]

As in TGI's tool: the prompt is lorem-ipsum text tokenized and left-truncated to exactly
`--sequence-length` tokens, every request of a batch is the same, greedy, and runs exactly
`--decode-length` tokens. One cycle per run: a prefill step for the whole batch (fresh rows),
read back, then decode steps (each row feeds the token just sampled, read back every step)
until every row has `--decode-length` tokens, i.e. decode-length - 1 steps. Each step is the
Runner's dispatch (packing, model, sampler) plus the read-back, so host work is included as
the engine pays it.

  prefill latency   one prefill step;  prefill throughput = B * S / latency
  decode (token)    decode total / steps; decode throughput = B * steps / decode total
  decode (total)    all decode steps of one cycle

Per batch size, after `--warmups` untimed cycles, `--runs` timed cycles; average, lowest,
highest and p50/p90/p99 (TGI's index: floor(p / 100 * n) of the sorted samples), printed as
TGI's latency and throughput tables (ms, tokens/s) and saved as JSON.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

from benchmarks.harness import print_table, write_json

LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation "
    "ullamco laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in "
    "reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur. "
) * 16
PAGE = 16


def summary(samples: list[float]) -> dict:
    """TGI's statistics of one series (seconds in, as given)."""
    ordered = sorted(samples)
    at = lambda p: ordered[min(len(ordered) - 1, math.floor(p / 100 * len(ordered)))]
    return {
        "average": sum(ordered) / len(ordered),
        "lowest": ordered[0],
        "highest": ordered[-1],
        "p50": at(50),
        "p90": at(90),
        "p99": at(99),
    }


def build_runner(loaded, max_batch: int, sequence: int, decode: int):
    from tgix.engine.buckets import Buckets
    from tgix.engine.runner import Runner, RunnerConfig

    pages_per_row = -(-(sequence + decode) // PAGE)
    buckets = Buckets.build(
        max_batch_prefill_tokens=max_batch * sequence,
        max_batch_size=max_batch,
        max_total_tokens=sequence + decode,
        page_size=PAGE,
    )
    config = RunnerConfig(num_pages=max_batch * pages_per_row + 1, page_size=PAGE, buckets=buckets)
    return Runner(loaded, config), pages_per_row


def cycle(runner, prompt: list[int], batch: int, decode: int, pages_per_row: int) -> dict:
    """One prefill + decode cycle of `batch` identical requests; seconds of each part."""
    from tgix.attention.pack import RowInput
    from tgix.engine.request import SamplingParams
    from tgix.engine.runner import Runner
    from tgix.engine.step_inputs import RowSampling

    greedy = SamplingParams()
    pages = [list(range(1 + i * pages_per_row, 1 + (i + 1) * pages_per_row)) for i in range(batch)]
    rows = [RowInput(prompt, 0, pages[i]) for i in range(batch)]
    sampling = [RowSampling(greedy, len(prompt), []) for _ in range(batch)]
    start = time.perf_counter()
    out = Runner.fetch(runner.run(rows, sampling))
    prefill = time.perf_counter() - start
    position, steps = len(prompt), []
    for _ in range(decode - 1):
        rows = [RowInput([int(out.token_ids[i])], position, pages[i]) for i in range(batch)]
        sampling = [RowSampling(greedy, position + 1, []) for _ in range(batch)]
        start = time.perf_counter()
        out = Runner.fetch(runner.run(rows, sampling))
        steps.append(time.perf_counter() - start)
        position += 1
    return {"prefill": prefill, "decode_total": sum(steps), "steps": len(steps)}


def measure(runner, prompt, batch: int, args, pages_per_row: int) -> dict:
    for _ in range(args.warmups):
        cycle(runner, prompt, batch, args.decode_length, pages_per_row)
    cycles = [
        cycle(runner, prompt, batch, args.decode_length, pages_per_row) for _ in range(args.runs)
    ]
    steps = cycles[0]["steps"]
    prefill = [c["prefill"] for c in cycles]
    total = [c["decode_total"] for c in cycles]
    return {
        "batch_size": batch,
        "prefill_latency_s": summary(prefill),
        "decode_token_latency_s": summary([t / steps for t in total]),
        "decode_total_latency_s": summary(total),
        "prefill_throughput_tok_s": summary([batch * args.sequence_length / t for t in prefill]),
        "decode_throughput_tok_s": summary([batch * steps / t for t in total]),
    }


def print_tgi_tables(results: list[dict]) -> None:
    cols = ["average", "lowest", "highest", "p50", "p90", "p99"]
    rows = []
    for name, key in (
        ("Prefill", "prefill_latency_s"),
        ("Decode (token)", "decode_token_latency_s"),
        ("Decode (total)", "decode_total_latency_s"),
    ):
        for r in results:
            rows.append([name, r["batch_size"], *(1e3 * r[key][c] for c in cols)])
    print_table("latency (ms)", ["step", "batch", *cols], rows)
    rows = []
    for name, key in (
        ("Prefill", "prefill_throughput_tok_s"),
        ("Decode", "decode_throughput_tok_s"),
    ):
        for r in results:
            rows.append([name, r["batch_size"], *(r[key][c] for c in cols[:3])])
    print_table("throughput (tokens/s)", ["step", "batch", *cols[:3]], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--sequence-length", type=int, default=10)
    parser.add_argument("--decode-length", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmups", type=int, default=1)
    parser.add_argument("--model-id", default=None, help="default: the embedded SmolLM2")
    parser.add_argument("--json", default="benchmarks/results/step_latency.json")
    args = parser.parse_args(argv)
    if args.decode_length < 2:
        parser.error("--decode-length must be >= 2 (the first token comes from the prefill)")
    logging.getLogger("tgix.engine.executables").setLevel(logging.ERROR)
    from benchmarks.harness import machine
    from tgix.models import load_model
    from tgix.tokenizer import load_tokenizer

    loaded = load_model(args.model_id)
    tokenizer = load_tokenizer(loaded.files)
    ids = tokenizer.encode(LOREM, add_special_tokens=False)
    prompt = ids[-args.sequence_length :]  # left-truncated, as TGI's tool does
    runner, pages_per_row = build_runner(
        loaded, max(args.batch_size), args.sequence_length, args.decode_length
    )
    compile_s = runner.executables.compile_all(progress=sys.stderr.isatty())
    results = []
    for batch in args.batch_size:
        results.append(measure(runner, prompt, batch, args, pages_per_row))
        r = results[-1]
        print(
            f"  batch {batch}: prefill {1e3 * r['prefill_latency_s']['p50']:.1f} ms, "
            f"decode {1e3 * r['decode_token_latency_s']['p50']:.2f} ms/token",
            flush=True,
        )
    print_tgi_tables(results)
    write_json(
        args.json,
        {"machine": machine(), "args": vars(args), "compile_s": compile_s, "results": results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
