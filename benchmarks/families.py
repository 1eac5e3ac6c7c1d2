"""Model families against transformers (issue 18): decode at batch 1 and 16 and prefill at 512
tokens, tgix and transformers on the same random weights in the same run, float32 on CPU.

    python -m benchmarks.families [--families llama gemma2 ...] [--json out.json]

Each family is its real small config scaled to this machine (100-250 M parameters; every
vocabulary 49152 so benchmarks.harness prompts fit), written with transformers' own class
and its default random init. tgix runs through `tgix.LLM` (benchmarks.engine's decode_run /
prefill_run: steady-phase decode tok/s of B greedy requests, prefill = L / TTFT); the MoE
families run once per expert path (`--moe-impls`, env TGIX_MOE_IMPL). transformers runs
`generate` (benchmarks.hf_reference: decode = B (N - 1) / (t(N) - t(1)), prefill L / t(1)).
For the MoE families the FLOPs of the expert matmuls actually spent are compared with a
dense model of the same active size: the sorted path computes each expert's rows padded to
its block (tgix/models/moe.py), counted from the engine's expert load of a decode step at
batch 16; dense computes every expert for every token. Medians over `--repeats`.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time

from benchmarks import harness
from benchmarks.engine import decode_run, prefill_run
from benchmarks.harness import median, print_table, ratio

V = 49152
_ATTN = {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}
CONFIGS = {  # family -> (transformers config class, fields): the real config, scaled
    "llama": ("LlamaConfig", {  # SmolLM2-135M exactly
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": True,
        "rope_theta": 100000.0}),
    "gemma2": ("Gemma2Config", {  # Gemma 2 2B: H 256, soft caps 50/30, windows 4096
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
        "query_pre_attn_scalar": 256, "sliding_window": 4096}),
    "gemma3": ("Gemma3TextConfig", {  # Gemma 3 1B: 1 KV head, windows 512, 5 local : 1 global
        "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "query_pre_attn_scalar": 256, "sliding_window": 512}),
    "phi3": ("Phi3Config", {  # Phi-3.5-mini: MHA, LongRoPE from 4096
        "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
        "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "short_factor": [1.0 + i / 32 for i in range(32)],
                            "long_factor": [1.0 + i for i in range(32)]}}),
    "mixtral": ("MixtralConfig", {  # Mixtral 8x7B: 8 experts, top-2
        "hidden_size": 512, "intermediate_size": 1792, "num_hidden_layers": 8, **_ATTN,
        "num_local_experts": 8, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", {  # Qwen3-30B-A3B: 128 -> 64 experts, top-8, narrow
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, **_ATTN,
        "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 192,
        "norm_topk_prob": True}),
}  # fmt: skip
MOE = ("mixtral", "qwen3_moe")


def write_family(family: str, folder: str) -> dict:
    """A random checkpoint of CONFIGS[family] + the test tokenizer; its parameter counts."""
    import torch
    import transformers

    from tgix import testing

    name, fields = CONFIGS[family]
    config = getattr(transformers, name)(
        vocab_size=V, max_position_embeddings=fields.pop("max_position_embeddings", 4096),
        bos_token_id=1, eos_token_id=2, pad_token_id=0, **fields,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, testing._model_class_name(config))(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    testing.write_test_tokenizer(folder)
    total = sum(p.numel() for p in model.parameters())
    counts = {"params_m": total / 1e6}
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", 0)
    if experts:
        k = config.num_experts_per_tok
        width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        one = 3 * config.hidden_size * width  # one expert's weights
        idle = config.num_hidden_layers * (experts - k) * one  # weights a token does not use
        counts |= {"experts": experts, "top_k": k, "expert_width": width,
                   "hidden": config.hidden_size, "layers": config.num_hidden_layers,
                   "active_m": (total - idle) / 1e6}  # fmt: skip
    return counts


def measure_tgix(folder: str, args, impl: str | None) -> dict:
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    if impl:
        os.environ["TGIX_MOE_IMPL"] = impl
    limits = LimitRequest(**harness.parse_limits(args.limit, args.kv_tokens))
    start = time.perf_counter()
    llm = LLM(folder, limits=limits, options=EngineOptions(progress=False))
    out = {"construct_s": time.perf_counter() - start, "decode": {}, "prefill": {}}
    try:
        for batch in args.batches:
            harness.run_batch(llm, [[1000 + i] * args.prompt_tokens for i in range(batch)], 4)
            runs = [decode_run(llm, batch, args, seed=100 * batch + i) for i in range(args.repeats)]
            out["decode"][batch] = median(r["decode_tok_s"] for r in runs)
            if batch == max(args.batches):
                out["load"] = llm.engine.stats()  # its last step: a decode step at B
        for length in args.prefill_lengths:
            prefill_run(llm, length, seed=length)
            ttfts = [
                prefill_run(llm, length, seed=length + 1 + i) for i in range(max(3, args.repeats))
            ]
            out["prefill"][length] = length / median(ttfts)
    finally:
        llm.close()
        os.environ.pop("TGIX_MOE_IMPL", None)
    return out


def measure_transformers(folder: str, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks import hf_reference

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.config.eos_token_id = 2
    decode = {
        b: hf_reference.decode_rates(model, b, args.prompt_tokens, args.new_tokens, args.repeats)[
            "decode_tok_s"
        ]
        for b in args.batches
    }
    prefill = {
        n: hf_reference.prefill_rate(model, n, max(args.repeats, 3))["tok_s"]
        for n in args.prefill_lengths
    }
    return {"decode": decode, "prefill": prefill}


def expert_flops(counts: dict, stats: dict, batch: int, impl: str) -> dict:
    """Expert-matmul FLOPs of one decode step at `batch` spent by `impl` (sorted: each
    expert's rows padded to its block; dense: every expert for every token) over those of a
    dense model of the same active size (the top-k experts' rows exactly), from the step's
    expert load."""
    from tgix.models.moe import _block_rows

    e, k, layers = counts["experts"], counts["top_k"], counts["layers"]
    per_row = 2 * 3 * counts["hidden"] * counts["expert_width"]
    load = [stats.get(f"expert_{i}_last_step", 0) for i in range(e)]
    block = _block_rows(batch * k, e)
    sorted_rows = sum(-(-n // block) * block for n in load)  # summed over layers already
    active = batch * k * layers
    spent = sorted_rows if impl == "sorted" else batch * e * layers
    return {
        "active_gflop": active * per_row / 1e9,
        "spent_gflop": spent * per_row / 1e9,
        "spent_over_active": spent / active if active else float("nan"),
        "load_rows": sum(load),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=[512])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--moe-impls", nargs="+", default=["sorted", "dense"])
    harness.add_common_args(parser)
    parser.set_defaults(kv_tokens=16384)
    args = parser.parse_args()
    args.limit = ["max_batch_size=16", "max_total_tokens=1024",
                  "max_batch_prefill_tokens=1024", *args.limit]  # fmt: skip
    results, rows = {"machine": harness.machine(), "families": {}}, []
    for family in args.families:
        with tempfile.TemporaryDirectory() as folder:
            counts = write_family(family, folder)
            impls = args.moe_impls if family in MOE else [None]
            ours = {impl: measure_tgix(folder, args, impl) for impl in impls}
            gc.collect()
            theirs = measure_transformers(folder, args)
            gc.collect()
        entry = {"counts": counts, "tgix": ours, "transformers": theirs}
        for impl, run in ours.items():
            label = family if impl is None else f"{family} ({impl})"
            row = [label, f"{counts['params_m']:.0f}"]
            for b in args.batches:
                row += [f"{run['decode'][b]:.1f}", f"{theirs['decode'][b]:.1f}",
                        f"{ratio(run['decode'][b], theirs['decode'][b]):.2f}x"]  # fmt: skip
            for n in args.prefill_lengths:
                row += [f"{run['prefill'][n]:.0f}", f"{theirs['prefill'][n]:.0f}",
                        f"{ratio(run['prefill'][n], theirs['prefill'][n]):.2f}x"]  # fmt: skip
            rows.append(row)
            if family in MOE:
                entry.setdefault("flops", {})[impl] = expert_flops(
                    counts, run["load"], max(args.batches), impl
                )
        results["families"][family] = entry
        print(f"{family}: {entry}", flush=True)
    header = ["family", "params M"]
    for b in args.batches:
        header += [f"B={b} tgix", f"B={b} hf", "ratio"]
    for n in args.prefill_lengths:
        header += [f"prefill {n} tgix", "hf", "ratio"]
    print_table("decode and prefill tok/s, tgix vs transformers (float32, CPU)", header, rows)
    flops = [
        [f, impl, f"{c['active_m']:.0f}", f"{x['active_gflop']:.2f}",
         f"{x['spent_gflop']:.2f}", f"{x['spent_over_active']:.2f}x"]
        for f, entry in results["families"].items() if "flops" in entry
        for impl, x in entry["flops"].items() for c in [entry["counts"]]
    ]  # fmt: skip
    if flops:
        print_table(
            f"expert FLOPs of a decode step at B={max(args.batches)} vs a dense model of the "
            "same active size",
            ["family", "expert path", "active M params", "active GFLOP", "spent GFLOP",
             "spent / active"],
            flops,
        )  # fmt: skip
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
