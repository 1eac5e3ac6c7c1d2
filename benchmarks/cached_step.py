"""One prompt step past a cached prefix against a fresh prompt step of the same new tokens:
what a cached chat turn's own step costs, by the length of the cached history.

    python -m benchmarks.cached_step [--prefix 16 256 1008] [--new 34] [--repeats 4]
        [--kv-tokens 65536]

The default model's engine in-process (`create_engine`, prefix caching on, classic prefill,
no HTTP), one request at a time, `max_new_tokens` 1, so each request is exactly one step (its
time from the engine's `on_step` hook: dispatch to read-back). Per --prefix length: one
request computes a random prefix (cached from then on), then --repeats requests of that
prefix + --new fresh random ids each run one step past it (a mixed shape: rows past a cached
prefix); and --repeats fresh prompts of --new ids (a fresh shape). Prints the median ms of
each (the first call of a shape is dropped when there are more than two), the cached step's
excess over the fresh one, and its growth per cached token between the shortest and the
longest prefix.
"""

from __future__ import annotations

import argparse

import numpy as np

from tgix.engine.factory import EngineOptions, create_engine
from tgix.engine.limits import LimitRequest
from tgix.engine.request import GenerationRequest
from tgix.models import load_model
from tgix.tokenizer import load_tokenizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, nargs="+", default=[16, 256, 1008])
    parser.add_argument("--new", type=int, default=34)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--kv-tokens", type=int, default=65536)
    args = parser.parse_args(argv)
    steps: list[float] = []
    loaded = load_model(None)
    engine = create_engine(
        loaded,
        load_tokenizer(loaded.files),
        LimitRequest(max_batch_total_tokens=args.kv_tokens),
        EngineOptions(prefix_caching=True, progress=False),
        on_step=lambda kind, seconds, rows, tokens, *, ok: steps.append(seconds),
    )
    rng = np.random.default_rng(0)
    ids = lambda n: [int(x) for x in rng.integers(100, 40000, n)]

    def step_ms(prompt: list[int]) -> float:
        steps.clear()
        request = GenerationRequest(prompt_ids=tuple(prompt), max_new_tokens=1, ignore_eos=True)
        list(engine.submit(request))
        return 1e3 * sum(steps)

    def median(samples: list[float]) -> float:
        return float(np.median(samples[1:] if len(samples) > 2 else samples))

    try:
        fresh = median([step_ms(ids(args.new)) for _ in range(args.repeats)])
        print(f"fresh {args.new} tokens: {fresh:.0f} ms")
        cached = {}
        for length in args.prefix:
            prefix = ids(length)
            step_ms(prefix)
            cached[length] = median([step_ms(prefix + ids(args.new)) for _ in range(args.repeats)])
            print(f"cached {length} + {args.new} new: {cached[length]:.0f} ms"
                  f" ({cached[length] - fresh:+.0f} ms over fresh)")  # fmt: skip
        lo, hi = min(cached), max(cached)
        if hi > lo:
            slope = (cached[hi] - cached[lo]) / (hi - lo)
            print(f"growth from {lo} to {hi} cached tokens: {slope:.3f} ms per cached token")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
