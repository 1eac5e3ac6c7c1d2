"""ONNX Runtime GenAI on static batches, run inside its own venv by benchmarks.peer_engines
(imports nothing of tgix). Reads {"model", "prompts", "levels", "new_tokens"} as JSON on
stdin, writes one row per level as JSON on stdout:

    {"concurrency": B, "output_token_throughput": B N / t(N), "ttft_p50": t(1),
     "tpot_p50": (t(N) - t(1)) / (N - 1), "e2e_p50": t(N)}

Each batch is B prompts (cycled) cut to the shortest one's tokens, so no padding (above 32
rows, the library's limit, batches of 32 one after another); greedy,
exactly N new tokens (EOS cannot end a row: min_length = max_length); t(k) is a fresh
generator's time to k new tokens, the median of 3 runs after a warm-up.
"""

import json
import statistics
import sys
import time

import numpy as np
import onnxruntime_genai as og

MAX_BATCH = 32  # onnxruntime-genai 0.18 refuses batch_size > 32 ("must be in [1, 32]")


def timed(model, rows: np.ndarray, new_tokens: int) -> float:
    """Seconds to generate new_tokens for every row: one generator per MAX_BATCH rows, one
    after another (what a caller of this library can do with more rows than that)."""
    return sum(
        timed_batch(model, rows[i : i + MAX_BATCH], new_tokens)
        for i in range(0, len(rows), MAX_BATCH)
    )


def timed_batch(model, rows: np.ndarray, new_tokens: int) -> float:
    batch, length = rows.shape
    params = og.GeneratorParams(model)
    total = length + new_tokens
    params.set_search_options(do_sample=False, batch_size=batch, max_length=total, min_length=total)
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(rows)
    made = 0
    while made < new_tokens:
        generator.generate_next_token()
        made += 1
    generator.get_next_tokens()
    elapsed = time.perf_counter() - start
    if made != new_tokens:
        raise RuntimeError(f"generated {made} tokens, not {new_tokens}")
    return elapsed


def main() -> None:
    request = json.load(sys.stdin)
    model = og.Model(request["model"])
    tokenizer = og.Tokenizer(model)
    ids = [tokenizer.encode(p) for p in request["prompts"]]
    shortest = min(len(i) for i in ids)
    n = request["new_tokens"]
    out = []
    for batch in request["levels"]:
        rows = np.stack([ids[i % len(ids)][:shortest] for i in range(batch)]).astype(np.int32)
        timed(model, rows, 2)  # warm-up
        t_one = statistics.median(timed(model, rows, 1) for _ in range(3))
        t_all = statistics.median(timed(model, rows, n) for _ in range(3))
        out.append({
            "concurrency": batch,
            "output_token_throughput": batch * n / t_all,
            "ttft_p50": t_one,
            "tpot_p50": (t_all - t_one) / (n - 1),
            "e2e_p50": t_all,
        })  # fmt: skip
        print(f"  onnxruntime-genai batch {batch}: {out[-1]['output_token_throughput']:.1f} tok/s",
              file=sys.stderr, flush=True)  # fmt: skip
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
