"""One MoE layer on an accelerator: the three expert paths of tgix/models/moe.py (ragged_dot,
the GPU/TPU default; sorted blocks, the CPU default; dense) at real MoE shapes, random weights.

    python -m benchmarks.gpu_moe [--shape mixtral qwen3-moe] [--tokens 1 16 256 2048]
    python -m benchmarks.gpu_moe --shape tiny --tokens 1 16    # CPU smoke test

Per shape and token count: ms per call (median of `--repeats` after one untimed call) for
each path in `--dtype`, and each path's max |difference| from the sorted path's output in
float32 (the paths must agree before their speed means anything). Called by
benchmarks.gpu_check.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SHAPES = {  # name -> (D, E, F, top-k)
    "mixtral": (4096, 8, 14336, 2),  # Mixtral 8x7B
    "qwen3-moe": (2048, 128, 768, 8),  # Qwen3-30B-A3B
    "tiny": (64, 8, 96, 2),
}


def layer(shape: str, dtype, impl: str):
    import jax.numpy as jnp
    from flax import nnx

    from tgix.models.config import ModelConfig
    from tgix.models.moe import SparseMoE

    d, e, f, k = SHAPES[shape]
    cfg = ModelConfig(
        model_type="mixtral", vocab_size=8, hidden_size=d, intermediate_size=f, num_layers=1,
        num_heads=1, num_kv_heads=1, head_dim=8, num_experts=e, experts_per_token=k,
        expert_size=f, moe_layers=(True,),
    )  # fmt: skip
    moe = SparseMoE(cfg, rngs=nnx.Rngs(0), dtype=jnp.dtype(dtype))
    moe.impl = impl
    return moe


def time_call(moe, x, repeats: int) -> tuple[float, np.ndarray]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graph, state = nnx.split(moe)
    call = jax.jit(lambda state, x: nnx.merge(graph, state)(x, jnp.int32(x.shape[0]))[0])
    out = call(state, x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(state, x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times)), np.asarray(out, np.float32)


def run(shapes, tokens, dtype: str = "bfloat16", repeats: int = 10) -> list[dict]:
    import jax
    import jax.numpy as jnp

    rows = []
    for shape in shapes:
        for t in tokens:
            x = jax.random.normal(jax.random.key(t), (t, SHAPES[shape][0]), jnp.float32)
            _, exact = time_call(layer(shape, "float32", "sorted"), x, 1)
            row = {"shape": shape, "tokens": t, "dtype": dtype}
            for impl in ("ragged", "sorted", "dense"):
                ms, _ = time_call(layer(shape, dtype, impl), x.astype(dtype), repeats)
                _, out32 = time_call(layer(shape, "float32", impl), x, 1)
                row[f"{impl}_ms"] = ms
                row[f"{impl}_max_diff"] = float(np.abs(out32 - exact).max())
            rows.append(row)
            print(
                f"{shape} T={t}: ragged {row['ragged_ms']:.2f} ms, sorted {row['sorted_ms']:.2f}, "
                f"dense {row['dense_ms']:.2f}; max diff ragged {row['ragged_max_diff']:.1e}, "
                f"dense {row['dense_max_diff']:.1e}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["mixtral", "qwen3-moe"], choices=SHAPES)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256, 2048])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    run(args.shape, args.tokens, args.dtype, args.repeats)


if __name__ == "__main__":
    main()
