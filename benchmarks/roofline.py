"""GEMV bandwidth and GEMM FLOP/s ceilings of this machine's JAX backend, on the model's weights.

    python -m benchmarks.roofline [--gemm-tokens 512] [--reps 10]

GEMV (decode, batch 1): one jitted program multiplies a [1, K] vector by every weight matrix of
the loaded default model in its own layout (the tied embedding as the LM head, contracted
over the hidden size), so it streams the model's weight bytes once: GB/s = bytes / time, and
the batch-1 decode ceiling is 1 / time tokens/s. A second program does the same bytes as one
[1, 4096] x [4096, N] float32 matrix (the backend's best-case streaming); the ceiling is the
faster of the two. Both let the backend run independent GEMVs at once (XLA:CPU spreads them
over the cores); a decoder cannot, since each layer waits on the last. A third program chains
the same matrices so that each product's input depends on the previous one: the sequential
ceiling, reported beside the first (not instead of it).

GEMM (prefill): the same chain with [T, K] activations over the layer matrices (prefill
computes logits for the last token only, so the vocabulary matrix is left out): GFLOP/s =
2 T params / time, prefill ceiling = T / time tokens/s (attention and elementwise work extra).
Medians of `--reps` timed calls after two warm-up calls.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.harness import median, print_table


def model_matrices(loaded) -> tuple[list[tuple[jax.Array, int]], list[bool]]:
    """(weight, number of leading input axes) for each matrix a decode step streams, and
    whether each one is the vocabulary (LM head) matrix."""
    cfg = loaded.config
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    mats, is_vocab = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(loaded.model))[0]:
        if leaf.ndim < 2:
            continue
        name = jax.tree_util.keystr(path)
        if "embed" in name:
            if not cfg.tie_word_embeddings:
                continue  # an untied embedding is gathered one row a token, not streamed
            mats.append((leaf, -1))  # [V, D] as the LM head: contract the last axis
            is_vocab.append(True)
            continue
        # kernels are [in..., out...]: q/k/v [D, H, hd], o_proj [H, hd, D], MLP [in, out]
        n_in = leaf.ndim - 1 if leaf.ndim == 3 and leaf.shape[-1] == hidden else 1
        mats.append((leaf, n_in))
        is_vocab.append(vocab in (leaf.shape[0], leaf.shape[-1]))
    return mats, is_vocab


def _chain(rows: int, mats: list[tuple[jax.Array, int]]):
    """A jitted f(xs, ws) computing xs[i] @ ws[i] for every matrix; the input vectors."""
    specs = []
    for w, n_in in mats:
        if n_in == -1:
            specs.append(((w.shape[-1],), ((1,), (w.ndim - 1,))))
        else:
            k_shape = w.shape[:n_in]
            specs.append((k_shape, (tuple(range(1, n_in + 1)), tuple(range(n_in)))))

    def run(xs, ws):
        return [
            jax.lax.dot_general(x, w, (dims, ((), ())))
            for x, w, (_, dims) in zip(xs, ws, specs, strict=True)
        ]

    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal((rows, *k)).astype(np.float32)) for k, _ in specs]
    return jax.jit(run), xs


def _dependent_chain(mats: list[tuple[jax.Array, int]]):
    """A jitted f(ws) multiplying a [1, K] vector by every matrix in model order where each
    product's input depends on the previous product (as a decoder's layers do), so no two
    GEMVs can run at the same time. The dependency is a scaled-down copy of one output
    element added to a fixed vector: negligible work beside the GEMV."""
    rng = np.random.default_rng(1)
    specs, inputs = [], []
    for w, n_in in mats:
        if n_in == -1:
            k_shape, dims = (w.shape[-1],), ((1,), (w.ndim - 1,))
        else:
            k_shape = w.shape[:n_in]
            dims = (tuple(range(1, n_in + 1)), tuple(range(n_in)))
        specs.append(dims)
        inputs.append(jnp.asarray(rng.standard_normal((1, *k_shape)).astype(np.float32)))

    def run(ws):
        carry = jnp.zeros((), jnp.float32)
        for x, w, dims in zip(inputs, ws, specs, strict=True):
            y = jax.lax.dot_general(x + 1e-6 * carry, w, (dims, ((), ())))
            carry = y.reshape(-1)[0]
        return carry

    return jax.jit(run)


def time_call(fn, *args, reps: int) -> float:
    """Median seconds of `reps` calls after two warm-up calls."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return median(times)


def gemv_ceiling(loaded, reps: int = 10) -> dict:
    mats, _ = model_matrices(loaded)
    weights = [w for w, _ in mats]
    nbytes = sum(w.size * w.dtype.itemsize for w in weights)
    fn, xs = _chain(1, mats)
    t_model = time_call(fn, xs, weights, reps=reps)

    k = 4096
    n = nbytes // (4 * k)
    big = jnp.ones((k, n), jnp.float32)
    x = jnp.ones((1, k), jnp.float32)
    t_big = time_call(jax.jit(jnp.matmul), x, big, reps=reps)
    big_bytes = big.size * 4
    del big
    gbps_model, gbps_big = nbytes / t_model / 1e9, big_bytes / t_big / 1e9
    best = max(gbps_model, gbps_big)
    t_dependent = time_call(_dependent_chain(mats), weights, reps=reps)
    return {
        "weight_bytes": nbytes,
        "dependent_chain_ms": t_dependent * 1e3,
        "dependent_chain_gb_s": nbytes / t_dependent / 1e9,
        "dependent_tok_s_ceiling": 1 / t_dependent,
        "model_chain_ms": t_model * 1e3,
        "model_chain_gb_s": gbps_model,
        "big_matrix_ms": t_big * 1e3,
        "big_matrix_gb_s": gbps_big,
        "gb_s": best,
        "batch1_tok_s_ceiling": best * 1e9 / nbytes,
    }


def gemm_ceiling(loaded, tokens: int = 512, reps: int = 5) -> dict:
    mats, is_vocab = model_matrices(loaded)
    mats = [m for m, v in zip(mats, is_vocab, strict=True) if not v]
    weights = [w for w, _ in mats]
    params = sum(w.size for w in weights)
    fn, xs = _chain(tokens, mats)
    t = time_call(fn, xs, weights, reps=reps)
    return {
        "tokens": tokens,
        "matmul_params": params,
        "chain_ms": t * 1e3,
        "gflop_s": 2 * tokens * params / t / 1e9,
        "prefill_tok_s_ceiling": tokens / t,
    }


def print_ceilings(gemv: dict, gemm: dict | None) -> None:
    rows = [
        ["GEMV, model's matrices", f"{gemv['model_chain_ms']:.1f} ms", gemv["model_chain_gb_s"]],
        ["GEMV, one big matrix", f"{gemv['big_matrix_ms']:.1f} ms", gemv["big_matrix_gb_s"]],
        [
            "GEMV, model's matrices in sequence",
            f"{gemv['dependent_chain_ms']:.1f} ms",
            gemv["dependent_chain_gb_s"],
        ],
    ]
    print_table("Ceilings (float32)", ["program", "time", "GB/s"], rows)
    print(
        f"weights {gemv['weight_bytes'] / 1e6:.0f} MB -> batch-1 decode ceiling "
        f"{gemv['batch1_tok_s_ceiling']:.1f} tok/s at {gemv['gb_s']:.1f} GB/s (the faster of the "
        f"first two); the same matrices one after another (each input waiting on the previous "
        f"product, as a decoder's layers do): {gemv['dependent_tok_s_ceiling']:.1f} tok/s"
    )
    if gemm:
        print(
            f"GEMM [{gemm['tokens']}, K] over the layer matrices: {gemm['chain_ms']:.0f} ms, "
            f"{gemm['gflop_s']:.1f} GFLOP/s -> prefill ceiling "
            f"{gemm['prefill_tok_s_ceiling']:.0f} tok/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    from tgix import load_model

    loaded = load_model()
    gemv = gemv_ceiling(loaded, reps=args.reps)
    gemm = gemm_ceiling(loaded, args.gemm_tokens, reps=max(3, args.reps // 2))
    print_ceilings(gemv, gemm)


if __name__ == "__main__":
    main()
