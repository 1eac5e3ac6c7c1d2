"""Sampler cost per call on this machine: ms (median of 20 after warm-up, jitted) by rows R for
V = 49152 and a few settings, for each candidate-set size K given.

    python -m benchmarks.sampling [--candidates 256 1024]
"""

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tgix.engine import sampling
from tgix.engine.request import SamplingParams
from tgix.engine.sampling_host import pack_history, pack_sampling

VOCAB = 49152
HISTORY = 1024
SETTINGS = {  # name -> (params of every row, num_top, history length)
    "greedy": (SamplingParams(), 0, 1),
    "greedy top5": (SamplingParams(), 5, 1),
    "T+top_k+top_p": (SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1), 0, 1),
    "T only": (SamplingParams(temperature=0.8, seed=1), 0, 1),
    "typical": (SamplingParams(typical_p=0.9, seed=1), 0, 1),
    "penalties": (
        SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3),
        0,
        HISTORY,
    ),
}


def time_call(rows: int, params: SamplingParams, num_top: int, length: int) -> float:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(rows, VOCAB)).astype(np.float32) * 4)
    arrays = sampling.SamplingArrays.from_host(pack_sampling([params] * rows, rows))
    history = pack_history([rng.integers(0, VOCAB, HISTORY).tolist()] * rows, rows, length)
    positions = jnp.arange(rows, dtype=jnp.int32)
    call = jax.jit(partial(sampling.sample, num_top=num_top, vocab_limit=VOCAB))
    args = (logits, arrays, positions, jnp.asarray(history))
    for _ in range(3):
        jax.block_until_ready(call(*args))
    times = []
    for _ in range(20):
        start = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, nargs="+", default=[sampling.CANDIDATES])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    print(f"{jax.devices()[0].platform}, V={VOCAB}, penalties with L={HISTORY}; ms per call")
    for candidates in args.candidates:
        sampling.CANDIDATES = candidates  # read when `sample` is traced
        print(f"\nK={candidates}  " + "".join(f"{name:>15}" for name in SETTINGS))
        for rows in args.rows:
            cells = [time_call(rows, *setting) for setting in SETTINGS.values()]
            print(f"R={rows:<7}" + "".join(f"{ms:15.2f}" for ms in cells))


if __name__ == "__main__":
    main()
