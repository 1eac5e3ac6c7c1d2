"""The decoder's dot layouts on this device. The LM head: [T, D] x [D, V] against [V, D] x
[D, T] then transposed (`tgix.models.decoder.HEAD_TRANSPOSED_ROWS`), alone and inside whole
model steps; the Dense layers: kernels stored [in, out] against [out, in]
(`tgix.models.out_major`, TGIX_DENSE_LAYOUT).

    python -m benchmarks.dot_layout [--rows 1 2 4 8 16 32 64 128] [--steps [head|dense]]
        [--mlp] [--repeats 10]

1. The default model's head (49,152 x 576, float32) alone for T rows: `x @ E.T`, and
   `E @ x.T` transposed behind an optimization barrier (without it XLA's simplifier folds
   the transpose back into the dot). Min over 25 calls, in ms.
2. `--steps` (or `--steps head`): whole model steps (the Runner's executables, rows past 300
   cached positions, and a 512-token prompt) compiled with the transposed head off and on;
   `--steps dense`: with the Dense kernels [in, out] (TGIX_DENSE_LAYOUT=in_out) and
   [out, in] (the CPU default), plus 64 decode rows. Alternated `--repeats` times; the min
   of each variant's medians of 9 calls. In `head`, a one-row decode step runs the same
   program in both (its head is a GEMV either way): the machine's noise floor.
3. `--mlp`: the default model's 30 MLP blocks chained (gate/up 576 -> 1,536, down back, SiLU,
   residual) for T rows, four ways: kernels [in, out] and `x @ W`; kernels [out, in] and
   each dot computed as `W @ x.T`, transposed back behind a barrier; [out, in] and
   `x @ W.T`; [out, in] with the activations kept feature-major [D, T] through the chain.
   Min over 20 calls, in ms.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time

import numpy as np

from benchmarks.harness import print_table, write_json
from tgix.models.out_major import out_major_matmul

PAGE = 16
ALWAYS, NEVER = (1, 1 << 30), (1, 0)  # out_major_matmul's transposed rows: every count, none


def call_ms(fn, calls: int) -> list[float]:
    """ms of each of `calls` calls of fn (warm: the caller has called it once)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def min_ms(fn, calls: int = 25) -> float:
    fn()
    return min(call_ms(fn, calls))


def head_alone(rows: list[int]) -> list[list]:
    import jax

    vocab, hidden = 49152, 576
    head = jax.random.normal(jax.random.key(0), (vocab, hidden)) * 0.02
    plain = jax.jit(lambda x, e: x @ e.T)
    transposed = jax.jit(lambda x, e: out_major_matmul(x, e, ALWAYS))
    out = []
    for t in rows:
        x = jax.random.normal(jax.random.key(t), (t, hidden))
        a = min_ms(lambda x=x: plain(x, head).block_until_ready())
        b = min_ms(lambda x=x: transposed(x, head).block_until_ready())
        out.append([t, a, b, b / a])
        print(f"  head, {t} rows: {a:.1f} / {b:.1f} ms", flush=True)
    return out


def mlp_layouts(rows: list[int]) -> list[list]:
    import jax

    layers, hidden, inner = 30, 576, 1536
    keys = iter(jax.random.split(jax.random.key(1), 3 * layers))
    weights = lambda *shape: [jax.random.normal(next(keys), shape) * 0.02 for _ in range(layers)]
    gate, up, down = weights(hidden, inner), weights(hidden, inner), weights(inner, hidden)
    gate_t, up_t, down_t = ([w.T.copy() for w in ws] for ws in (gate, up, down))  # [out, in]

    def in_out(x, gate, up, down):
        for g, u, d in zip(gate, up, down, strict=True):
            x = x + (jax.nn.silu(x @ g) * (x @ u)) @ d
        return x

    def out_in(x, gate, up, down):
        dot = lambda w, x: out_major_matmul(x, w, ALWAYS)  # W @ x.T, transposed: [T, out]
        for g, u, d in zip(gate, up, down, strict=True):
            x = x + dot(d, jax.nn.silu(dot(g, x)) * dot(u, x))
        return x

    def out_in_plain(x, gate, up, down):
        dot = lambda w, x: out_major_matmul(x, w, NEVER)  # x @ W.T: [T, out]
        for g, u, d in zip(gate, up, down, strict=True):
            x = x + dot(d, jax.nn.silu(dot(g, x)) * dot(u, x))
        return x

    def feature_major(x, gate, up, down):
        x_dt = x.T
        for g, u, d in zip(gate, up, down, strict=True):
            x_dt = x_dt + d @ (jax.nn.silu(g @ x_dt) * (u @ x_dt))
        return x_dt.T

    variants = [(in_out, (gate, up, down)), (out_in, (gate_t, up_t, down_t))]
    variants.append((out_in_plain, (gate_t, up_t, down_t)))
    variants.append((feature_major, (gate_t, up_t, down_t)))
    out = []
    for t in rows:
        x = jax.random.normal(jax.random.key(t), (t, hidden)) * 0.1
        times = []
        for fn, ws in variants:
            compiled = jax.jit(fn).lower(x, *ws).compile()
            times.append(min_ms(lambda c=compiled, ws=ws, x=x: c(x, *ws).block_until_ready(), 20))
        out.append([t, *times, *(m / times[0] for m in times[1:])])
        print(f"  MLP chain, {t} rows: " + " / ".join(f"{m:.1f}" for m in times), flush=True)
    return out


def whole_steps(repeats: int, compare: str) -> list[list]:
    from tgix.attention.pack import RowInput
    from tgix.engine.buckets import Buckets, StepShape
    from tgix.engine.runner import Runner, RunnerConfig
    from tgix.models import load_model

    buckets = Buckets.build(
        max_batch_prefill_tokens=512,
        max_batch_size=64,
        max_total_tokens=2048,
        page_size=PAGE,
        chunked_prefill=True,
    )
    pages = lambda i: list(range(1 + 20 * i, 21 + 20 * i))
    decode = lambda n: [RowInput([5], 300, pages(i)) for i in range(n)]
    verify = StepShape(False, 8, 1, buckets.pages_per_row, verify=True)
    cases = {
        "decode, 1 row": (decode(1), None),
        "decode, 8 rows": (decode(8), None),
        "decode, 32 rows": (decode(32), None),
        "verify, 1 row x 8": ([RowInput([5] * 8, 300, pages(0))], verify),
        "mixed, 3 decode + 80-token prompt": (decode(3) + [RowInput([7] * 80, 0, pages(5))], None),
        "prefill, 1 row x 512": ([RowInput([7] * 512, 0, list(range(1, 33)))], None),
    }  # fmt: skip
    if compare == "dense":
        cases["decode, 64 rows"] = (decode(64), None)
    calls = {}
    for variant in ("off", "on"):
        with _layout(compare, on=variant == "on"):
            loaded = load_model()  # the Dense layout is chosen as the model loads
            runner = Runner(
                loaded, RunnerConfig(num_pages=64 * 20 + 1, page_size=PAGE, buckets=buckets)
            )
            for name, (rows, shape) in cases.items():
                calls[name, variant] = _step_call(runner, rows, shape or buckets.shape_for(rows))
    medians: dict = {}
    for rep in range(repeats):
        for name in cases:
            for variant in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                median = float(np.median(call_ms(calls[name, variant], 9)))
                medians.setdefault((name, variant), []).append(median)
    out = []
    for name in cases:
        off, on = min(medians[name, "off"]), min(medians[name, "on"])
        out.append([name, off, on, on / off])
        print(f"  {name}: {off:.1f} / {on:.1f} ms", flush=True)
    return out


@contextlib.contextmanager
def _layout(compare: str, *, on: bool):
    """The model's dot layout while a variant loads and traces: `head`, the LM head's
    transposed product (decoder.HEAD_TRANSPOSED_ROWS, read as a step is traced) off or on;
    `dense`, the Dense kernels [in, out] or [out, in] (TGIX_DENSE_LAYOUT, read as the model
    loads)."""
    from tgix.models import decoder

    saved_rows, saved_env = decoder.HEAD_TRANSPOSED_ROWS, os.environ.get("TGIX_DENSE_LAYOUT")
    if compare == "head" and not on:
        decoder.HEAD_TRANSPOSED_ROWS = (2, 1)  # no row count
    os.environ["TGIX_DENSE_LAYOUT"] = "out_in" if compare == "head" or on else "in_out"
    try:
        yield
    finally:
        decoder.HEAD_TRANSPOSED_ROWS = saved_rows
        if saved_env is None:
            os.environ.pop("TGIX_DENSE_LAYOUT")
        else:
            os.environ["TGIX_DENSE_LAYOUT"] = saved_env


def _step_call(runner, rows, shape):
    from benchmarks.breakdown import step_call

    call = step_call(runner, rows, shape)
    call()  # compiles, and pays the first call's set-up
    return call


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument(
        "--steps",
        nargs="?",
        const="head",
        choices=["head", "dense"],
        help="also whole model steps, the head's layout (default) or the Dense kernels' off/on",
    )
    parser.add_argument("--mlp", action="store_true", help="also the MLP chain's layouts")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default="benchmarks/results/dot_layout.json")
    args = parser.parse_args(argv)
    logging.getLogger("tgix.engine.executables").setLevel(logging.ERROR)
    result = {"head": head_alone(args.rows)}
    print_table(
        "LM head alone (ms, min of 25)",
        ["rows", "x @ E.T", "E @ x.T, transposed", "ratio"],
        result["head"],
    )
    if args.steps:
        result["steps"] = whole_steps(args.repeats, args.steps)
        what = {"head": "transposed head", "dense": "Dense kernels [out, in]"}[args.steps]
        print_table(
            f"model steps, {what} off / on (ms, min of medians)",
            ["step", "off", "on", "on / off"],
            result["steps"],
        )
    if args.mlp:
        result["mlp"] = mlp_layouts(args.rows)
        print_table(
            "30 MLP blocks chained (ms, min of 20)",
            ["rows", "[in, out], x @ W", "[out, in], W @ x.T", "[out, in], x @ W.T",
             "[out, in], feature-major", "ratio", "ratio", "ratio"],
            result["mlp"],
        )  # fmt: skip
    write_json(args.json, {"args": vars(args), **result})


if __name__ == "__main__":
    main()
