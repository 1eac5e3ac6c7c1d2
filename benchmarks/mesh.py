"""Mesh experiments: every (data, model) layout of the visible devices, one engine step each.

    python -m benchmarks.mesh [--devices 8] [--model-id PATH] [--batch 16] [--context 256]
                              [--prompt 256] [--reps 5] [--json PATH] [--plot PATH]

For each model-axis width the model's heads allow (tgix.sharding.valid_shard_counts) and each
data degree that fills the devices with it, the weights are placed once per replica (a
replica is a (1, model) sub-mesh, the way `--num-shard` serves) and each replica's Runner
runs the engine's own steps: a decode step of batch/data rows at `--context` tokens of KV,
and a fresh prefill of one `--prompt`-token prompt per replica. Replicas are dispatched
back to back and awaited together, so their devices work at the same time. Reported per
layout: median step latency, decode and prefill tokens/s over all replicas, and per-device
parameter and KV bytes (measured from the arrays' shards on the first device).

On CPU, `--devices N` simulates N devices (XLA_FLAGS, set before jax loads): they share the
host's cores, so the sweep shows the collectives' and partitioning's cost, not a speed-up;
on GPU/TPU the same command measures the real devices.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.harness import median, print_table, write_json


def _force_devices(count: int) -> None:
    if "jax" in sys.modules:
        raise RuntimeError("--devices must be set before jax is imported")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def layouts(cfg, devices: int) -> list[tuple[int, int]]:
    """(data, model) pairs: every valid model width, replicas filling the devices."""
    from tgix.sharding import valid_shard_counts

    out = []
    for model in valid_shard_counts(cfg, devices):
        data = 1
        while data * model <= devices:
            out.append((data, model))
            data *= 2
    return out


def replicas(base, data: int, model: int):
    """`data` LoadedModels, each a (1, model) sub-mesh holding its own copy of the weights
    (the layout `--data-parallel` serves)."""
    from tgix.models import place
    from tgix.sharding import replica_meshes

    meshes = replica_meshes(model, data)
    return [base if r == 0 else place(base, mesh) for r, mesh in enumerate(meshes)]


def device_bytes(arrays, device) -> int:
    import jax

    return sum(
        s.data.nbytes
        for a in jax.tree.leaves(arrays)
        for s in a.addressable_shards
        if s.device == device
    )


def measure(base, data: int, model: int, args) -> dict:
    import jax

    from tgix.attention.pack import RowInput
    from tgix.engine.buckets import Buckets
    from tgix.engine.request import SamplingParams
    from tgix.engine.runner import Runner, RunnerConfig
    from tgix.engine.step_inputs import RowSampling

    page = 16
    rows_per_replica = max(1, args.batch // data)
    pages_per_row = -(-(args.context + 1) // page)
    buckets = Buckets.build(
        max_batch_prefill_tokens=args.prompt,
        max_batch_size=rows_per_replica,
        max_total_tokens=max(args.context + 1, args.prompt),
        page_size=page,
    )
    num_pages = max(rows_per_replica * pages_per_row, -(-args.prompt // page)) + 1
    config = RunnerConfig(num_pages=num_pages, page_size=page, buckets=buckets)
    runners = [Runner(m, config) for m in replicas(base, data, model)]
    greedy = SamplingParams()
    decode = [
        RowInput([7], args.context, list(range(1 + i * pages_per_row, 1 + (i + 1) * pages_per_row)))
        for i in range(rows_per_replica)
    ]
    prefill_pages = list(range(1, 1 + -(-args.prompt // page)))
    prefill = [RowInput(list(range(100, 100 + args.prompt)), 0, prefill_pages)]

    def step(rows) -> float:
        sampling = [RowSampling(greedy, r.start_pos + len(r.token_ids), []) for r in rows]
        start = time.perf_counter()
        outs = [runner.run(rows, sampling) for runner in runners]
        jax.block_until_ready([o.token_ids for o in outs])
        return time.perf_counter() - start

    result = {"data": data, "model": model, "devices": data * model}
    for name, rows, tokens in (
        ("decode", decode, rows_per_replica * data),
        ("prefill", prefill, args.prompt * data),
    ):
        step(rows), step(rows)  # compile, warm
        latency = median(step(rows) for _ in range(args.reps))
        result[f"{name}_ms"] = latency * 1e3
        result[f"{name}_tok_s"] = tokens / latency
    first = runners[0]
    device = first.mesh.devices.flat[0]
    result["param_mib_per_device"] = device_bytes(first._state, device) / 2**20
    result["kv_mib_per_device"] = device_bytes(first.kv, device) / 2**20
    return result


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r['data']}x{r['model']}" for r in results]
    for ax, key, title in (
        (axes[0], "decode_tok_s", "decode tokens/s (all replicas)"),
        (axes[1], "decode_ms", "decode step latency (ms)"),
    ):
        ax.bar(labels, [r[key] for r in results])
        ax.set_title(title)
        ax.set_xlabel("data x model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=8, help="CPU: simulated devices")
    parser.add_argument("--model-id", default=None, help="default: the embedded SmolLM2")
    parser.add_argument("--batch", type=int, default=16, help="decode rows over all replicas")
    parser.add_argument("--context", type=int, default=256, help="KV tokens per decode row")
    parser.add_argument("--prompt", type=int, default=256, help="prefill tokens per replica")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default="benchmarks/results/mesh.json")
    parser.add_argument("--plot", default="benchmarks/results/mesh.png")
    args = parser.parse_args(argv)
    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu" and args.devices > 1:
        _force_devices(args.devices)
    import logging

    import jax

    from benchmarks.harness import machine

    logging.getLogger("tgix.engine.executables").setLevel(logging.ERROR)  # compiled lazily here
    from tgix.models import load_model

    loaded = {1: load_model(args.model_id)}
    results = []
    for data, model in layouts(loaded[1].config, jax.device_count()):
        if model not in loaded:  # KV heads repeated for this width where needed
            loaded[model] = load_model(args.model_id, num_shard=model)
        results.append(measure(loaded[model], data, model, args))
        r = results[-1]
        print(f"  data={data} model={model}: decode {r['decode_ms']:.1f} ms", flush=True)
    header = [
        "data",
        "model",
        "decode ms",
        "decode tok/s",
        "prefill ms",
        "prefill tok/s",
        "params MiB/dev",
        "KV MiB/dev",
    ]
    rows = [
        [
            r["data"],
            r["model"],
            r["decode_ms"],
            r["decode_tok_s"],
            r["prefill_ms"],
            r["prefill_tok_s"],
            r["param_mib_per_device"],
            r["kv_mib_per_device"],
        ]
        for r in results
    ]
    title = (
        f"mesh layouts on {jax.device_count()} {jax.default_backend()} devices: decode batch "
        f"{args.batch} at {args.context} KV tokens, prefill {args.prompt} tokens per replica"
    )
    print_table(title, header, rows)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    write_json(args.json, {"machine": machine(), "args": vars(args), "layouts": results})
    try:
        plot(results, args.plot)
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
