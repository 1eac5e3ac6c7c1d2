"""Engine start-up time: launch to a healthy `tgix.LLM` (weights, KV, executables, warm-up request).

    TGIX_CACHE=$(mktemp -d) python -m benchmarks.startup    # cold: compiles every bucket
    TGIX_CACHE=<same dir> python -m benchmarks.startup      # warm: loads serialized executables

Prints one JSON line: `import_s` (import tgix), `construct_s` (LLM(...) until healthy),
`compile_s` (the runner's compile_all: compiling, or loading from the cache), `executables`,
and `ready_s` (from `--launched-at`, the parent's time.time() before it started this process,
to healthy; else from this module's first line). `benchmarks.engine` runs it twice in a fresh
TGIX_CACHE. The KV budget is pinned (`--kv-tokens`) so both starts build the same executables.
"""

import time

_T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launched-at", type=float, default=None)
    parser.add_argument("--kv-tokens", type=int, default=None)
    parser.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    launched = args.launched_at or _T0

    start = time.perf_counter()
    from benchmarks.harness import DEFAULT_KV_TOKENS, parse_limits
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    imported = time.perf_counter()
    kv = DEFAULT_KV_TOKENS if args.kv_tokens is None else args.kv_tokens
    limits = LimitRequest(**parse_limits(args.limit, kv))
    llm = LLM(limits=limits, options=EngineOptions(progress=False))
    ready = time.perf_counter()
    healthy_at = time.time()
    runner = llm.engine.runner
    result = {
        "import_s": imported - start,
        "construct_s": ready - imported,
        "compile_s": runner.executables.compile_seconds,
        "executables": len(runner.executables),
        "ready_s": healthy_at - launched,
        "healthy": llm.engine.healthy(),
        "max_batch_total_tokens": llm.engine.limits.max_batch_total_tokens,
    }
    llm.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
