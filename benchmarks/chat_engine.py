"""The multi-turn chat load of benchmarks.chat_load in-process, with the engine's own step
timings: where a chat turn's time goes with the prefix cache on or off, classic or chunked.

    python -m benchmarks.chat_engine [--cache on|off] [--chunked [--prefill-tokens B]]
        [--conversations 8] [--turns 4] [--system-tokens 1000] [--max-tokens 32]
        [--kv-tokens 65536]

The default model's engine (`create_engine`, no HTTP), `--conversations` threads each sending
`--turns` requests in sequence: a shared prefix of `--system-tokens` random token ids, then
per turn 30 random ids and the previous answer's ids (`ignore_eos`, `--max-tokens` each).
Prints TTFT p50 per turn, output tok/s, per step kind (TGI's prefill/decode label) the count,
total and median seconds and tokens, the slowest steps, and the engine's prefix-cache stats.
Step durations run from dispatch to read-back, so overlapped decode steps add up to more
than the wall time.
"""

from __future__ import annotations

import argparse
import collections
import threading
import time

import numpy as np

from tgix.engine.factory import EngineOptions, create_engine
from tgix.engine.limits import LimitRequest
from tgix.engine.request import Completion, GenerationRequest
from tgix.models import load_model
from tgix.tokenizer import load_tokenizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", choices=("on", "off"), default="on")
    parser.add_argument("--chunked", action="store_true")
    parser.add_argument(
        "--prefill-tokens",
        type=int,
        default=None,
        help="a step's token budget (the engine's default if unset)",
    )
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-tokens", type=int, default=65536)
    args = parser.parse_args(argv)
    steps: list[tuple[str, float, int, int]] = []
    loaded = load_model(None)
    engine = create_engine(
        loaded,
        load_tokenizer(loaded.files),
        LimitRequest(
            max_batch_total_tokens=args.kv_tokens,
            max_batch_prefill_tokens=args.prefill_tokens,
            chunked_prefill=args.chunked,
        ),
        EngineOptions(prefix_caching=args.cache == "on", progress=False),
        on_step=lambda kind, s, rows, tokens, *, ok: steps.append((kind, s, rows, tokens)),
    )
    rng = np.random.default_rng(0)
    shared = [int(x) for x in rng.integers(100, 40000, args.system_tokens)]
    ttft: dict[int, list[float]] = collections.defaultdict(list)

    def conversation() -> None:
        history = list(shared)
        for turn in range(args.turns):
            history += [int(x) for x in rng.integers(100, 40000, 30)]
            request = GenerationRequest(
                prompt_ids=tuple(history), max_new_tokens=args.max_tokens, ignore_eos=True
            )
            start, first, answer = time.monotonic(), None, []
            for event in engine.submit(request):
                first = first if first is not None else time.monotonic() - start
                if isinstance(event, Completion):
                    answer = [t.id for t in event.tokens]
            ttft[turn].append(first)
            history += answer

    time.sleep(3)
    steps.clear()
    start = time.monotonic()
    threads = [threading.Thread(target=conversation) for _ in range(args.conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    tokens = args.conversations * args.turns * args.max_tokens
    mode = "chunked" if args.chunked else "classic"
    print(
        f"cache {args.cache}, {mode} prefill, {engine.limits.max_batch_prefill_tokens}-token steps"
    )
    print(f"wall {wall:.1f} s, output {tokens / wall:.1f} tok/s")
    for turn in range(args.turns):
        print(f"turn {turn + 1}: TTFT p50 {np.median(ttft[turn]):.2f} s")
    later = [t for turn in range(1, args.turns) for t in ttft[turn]]
    if later:
        p50, p90 = np.percentile(later, [50, 90])
        print(f"turns 2-{args.turns}: TTFT p50 {p50:.2f} s, p90 {p90:.2f} s")
    by_kind = collections.defaultdict(list)
    for kind, seconds, _, n in steps:
        by_kind[kind].append((seconds, n))
    for kind, rows in by_kind.items():
        secs = np.array([s for s, _ in rows])
        print(
            f"{kind}: {len(rows)} steps, {secs.sum():.1f} s, median {1e3 * np.median(secs):.0f}"
            f" ms, {sum(n for _, n in rows)} tokens"
        )
    slow = sorted(steps, key=lambda s: -s[1])[:8]
    print("slowest (kind, ms, rows, tokens):", [(k, round(1e3 * s), r, n) for k, s, r, n in slow])
    stats = engine.stats()
    print({k: stats[k] for k in ("prefix_hit_tokens", "prefix_lookup_tokens", "prefix_hit_rate")})
    engine.shutdown()


if __name__ == "__main__":
    main()
