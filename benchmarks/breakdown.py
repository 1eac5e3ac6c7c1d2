"""Where a step's time goes: the default model's compiled steps and one decoder layer's parts,
timed separately on the device (no HTTP, no scheduler, no sampler).

    python -m benchmarks.breakdown [--prompt 80] [--json PATH]

1. Model steps (the Runner's executables, KV of ~100 tokens a decode row): decode at batch
   1/4/8/32/64; fresh prefill of 1/4/8/32 prompts of `--prompt` tokens (padded to their
   bucket); mixed steps (decode rows plus a prompt, as chunked prefill runs them).
2. One layer at T = 32 prompts packed (fresh): the whole layer, its attention block (norm,
   q/k/v, rope, KV write, attention, o_proj), its MLP block, and prefill attention alone.
3. Decode attention alone per layer (paged_attention) at batch 1/8/32/64.
4. The layers' matrices alone, chained, at batch 1/2/4/8 (XLA:CPU's GEMV at batch 1 is
   faster per byte than its small-batch GEMM: the step from 1 to 4 rows is mostly here).
Medians of repeated calls after a warm-up, in ms. What this showed when it was written
(BENCHMARKS.md): decode attention is ~40% of a batch-32 decode step, and prompt attention in
256-token blocks cost 2.5x the 32-token blocks on short prompts.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time

import numpy as np

from benchmarks.harness import print_table, write_json

PAGE = 16


def median_ms(fn, reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def metadata(rows, shape):
    import jax.numpy as jnp

    from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata
    from tgix.attention.pack import pack_step

    packed = pack_step(
        rows,
        page_size=PAGE,
        num_tokens=shape.num_tokens,
        num_rows=shape.num_rows,
        pages_per_row=shape.pages_per_row,
    )
    md = AttentionMetadata(**{k: jnp.asarray(packed[k]) for k in METADATA_FIELDS})
    return packed, md


def step_call(runner, rows, shape):
    """A call of the model executable alone on these rows (the KV pages donated and taken
    back each call; a verify shape returns every token's logits)."""
    packed, md = metadata(rows, shape)
    step = runner.executables.model_for(shape)
    indices = shape.logits_indices(packed["logits_indices"])

    def call():
        out = step(runner._params, packed["token_ids"], runner.kv, md, indices, {})
        runner.kv = out[-1]  # -> logits, prompt scores, drafts, expert load, kv
        out[0].block_until_ready()

    return call


def time_step(runner, rows, shape) -> float:
    """Median ms of the model executable alone."""
    return median_ms(step_call(runner, rows, shape))


def model_steps(runner, prompt: int, rng) -> list[list]:
    """(step, shape, ms) for decode, fresh and mixed steps: the model executable only."""
    from tgix.attention.pack import RowInput

    pages = lambda i: list(range(1 + 16 * i, 17 + 16 * i))  # 256 tokens a row
    decode = lambda n: [RowInput([int(rng.integers(1000))], 100, pages(i)) for i in range(n)]
    fresh = lambda n, at: [
        RowInput(rng.integers(1000, size=prompt).tolist(), 0, pages(at + i)) for i in range(n)
    ]
    cases = [(f"decode batch {n}", decode(n)) for n in (1, 4, 8, 32, 64)]
    cases += [(f"prefill {n} x {prompt}", fresh(n, 64)) for n in (1, 4, 8, 32)]
    cases += [(f"mixed {d} decode + {n} x {prompt}", decode(d) + fresh(n, 64)) for d, n in
              ((3, 1), (28, 4))]  # fmt: skip
    out = []
    for name, rows in cases:
        shape = runner.config.buckets.shape_for(rows)
        ms = time_step(runner, rows, shape)
        out.append([name, f"T={shape.num_tokens} R={shape.num_rows}", ms])
        print(f"  {name}: {ms:.1f} ms", flush=True)
    return out


def layer_parts(model, prompt: int) -> list[list]:
    """One decoder layer at 32 packed prompts: whole, attention block, MLP block, kernel."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tgix.attention.contract import LayerKV
    from tgix.attention.pack import RowInput
    from tgix.attention.xla import prefill_attention
    from tgix.engine.buckets import StepShape
    from tgix.models.layers import rope_cos_sin

    cfg, n = model.cfg, 32
    t = -(-n * prompt // 256) * 256
    per_row = -(-prompt // PAGE)
    rows = [RowInput([1] * prompt, 0, list(range(1 + i * per_row, 1 + (i + 1) * per_row)))
            for i in range(n)]  # fmt: skip
    _, md = metadata(rows, StepShape(True, t, 64, 0))
    x = jax.random.normal(jax.random.key(0), (t, cfg.hidden_size))
    graph, state = nnx.split(model.layers[0])
    shape = (n * per_row + 1, PAGE, cfg.num_kv_heads, cfg.head_dim)
    kv = LayerKV(jnp.zeros(shape), jnp.zeros(shape))
    cos, sin = rope_cos_sin(cfg, md.positions, md.kv_lens[md.token_rows])
    layer = lambda s: nnx.merge(graph, s)
    whole = jax.jit(lambda s, x: layer(s)(x, cos, sin, kv, md, True)[0])
    attn = jax.jit(
        lambda s, x: x + layer(s).self_attn(layer(s).input_layernorm(x), cos, sin, kv, md, True)[0]
    )
    mlp = jax.jit(lambda s, x: x + layer(s).mlp(layer(s).post_attention_layernorm(x)))
    q = jax.random.normal(jax.random.key(1), (t, cfg.num_heads, cfg.head_dim))
    k = q[:, : cfg.num_kv_heads]
    kernel = jax.jit(lambda q, k: prefill_attention(q, k, k, md))
    parts = [
        ("layer", lambda: whole(state, x).block_until_ready()),
        ("  attention block", lambda: attn(state, x).block_until_ready()),
        ("    prefill_attention", lambda: kernel(q, k).block_until_ready()),
        ("  MLP block", lambda: mlp(state, x).block_until_ready()),
    ]
    return [[name, f"T={t}, {n} x {prompt}", median_ms(fn)] for name, fn in parts]


def decode_attention(cfg) -> list[list]:
    import jax

    from tgix.attention.pack import RowInput
    from tgix.attention.xla import paged_attention
    from tgix.engine.buckets import StepShape

    shape = (64 * 8 + 1, PAGE, cfg.num_kv_heads, cfg.head_dim)
    k_pages = jax.random.normal(jax.random.key(0), shape)
    out = []
    for n in (1, 8, 32, 64):
        rows = [RowInput([1], 100, list(range(1 + 8 * i, 9 + 8 * i))) for i in range(n)]
        _, md = metadata(rows, StepShape(False, n, n, 256))
        q = jax.random.normal(jax.random.key(1), (n, cfg.num_heads, cfg.head_dim))
        call = functools.partial(jax.jit(paged_attention), q, k_pages, k_pages, md)
        ms = median_ms(lambda call=call: call().block_until_ready(), reps=15)
        out.append([f"decode attention batch {n}", "per layer, KV 100", ms])
    return out


def matmul_chain(model) -> list[list]:
    """The decoder layers' matrices alone, multiplied one after another by [B, D]: what a
    decode step's weight streaming costs at batch B with nothing else computed."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    vocab = model.cfg.vocab_size
    mats = [p for p in jax.tree.leaves(nnx.state(model)) if p.ndim == 2 and p.shape[0] != vocab]
    fit = lambda h, n: h[:, :n] if h.shape[1] >= n else jnp.pad(h, ((0, 0), (0, n - h.shape[1])))

    @jax.jit
    def chain(x, mats):
        for w in mats:
            x = fit(x, w.shape[0]) @ w
        return x

    out = []
    for batch in (1, 2, 4, 8):
        x = jnp.ones((batch, model.cfg.hidden_size))
        call = functools.partial(chain, x, mats)
        ms = median_ms(lambda call=call: call().block_until_ready(), reps=9)
        out.append([f"layer matmul chain batch {batch}", f"{len(mats)} matrices", ms])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=80, help="prompt tokens")
    parser.add_argument("--json", default="benchmarks/results/breakdown.json")
    args = parser.parse_args(argv)
    logging.getLogger("tgix.engine.executables").setLevel(logging.ERROR)
    from tgix.engine.buckets import Buckets
    from tgix.engine.runner import Runner, RunnerConfig
    from tgix.models import load_model

    loaded = load_model()
    buckets = Buckets.build(
        max_batch_prefill_tokens=4096,
        max_batch_size=64,
        max_total_tokens=4096,
        page_size=PAGE,
        chunked_prefill=True,
    )
    runner = Runner(
        loaded, RunnerConfig(num_pages=64 * 16 * 2 + 1, page_size=PAGE, buckets=buckets)
    )
    rows = model_steps(runner, args.prompt, np.random.default_rng(0))
    rows += layer_parts(loaded.model, args.prompt)
    rows += decode_attention(loaded.config)
    rows += matmul_chain(loaded.model)
    print_table("step and layer times (ms, medians)", ["what", "shape", "ms"], rows)
    write_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
