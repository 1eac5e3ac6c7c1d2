"""The accelerator check of the sharding issue, as one prepared script: bf16 greedy parity with
float32 on CPU for the default model, and decode throughput on one accelerator.

    python -m benchmarks.gpu_check [--tokens 32] [--batches 1 8 32] [--json PATH]
    python -m benchmarks.gpu_check --device cpu --tokens 4 --no-throughput --no-quant \
        --no-moe --no-vision  # smoke

Parity: the same prompts run greedily through the engine's own step (tests/paged-style
driver: one prefill, then one token at a time) twice, float32 on the CPU backend (the
reference) and bfloat16 on the accelerator; reported per prompt: tokens equal before the first
divergence, and the max |logit| difference at the first step (bf16 keeps ~3 significant
digits, so long greedy runs may part at near-ties; the first-step logits say whether the
numerics are sound). Throughput: `tgix.LLM` on the accelerator in bfloat16, B requests of 32
random prompt tokens, `--new-tokens` each, ignore_eos; decode tok/s over the steady phase as
benchmarks.engine measures it. Quantized decode (benchmarks.gpu_quant): bf16 vs int8 vs
4-bit kept on Llama-3-8B-shaped random layers. MoE (benchmarks.gpu_moe): one Mixtral-8x7B-
and one Qwen3-30B-A3B-shaped MoE layer through ragged_dot, sorted blocks and dense. Vision
(benchmarks.vision.encoder_only): SmolVLM-256M's tower on 5 tiles in bfloat16. One JSON with
all, for the closing note.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "List three prime numbers:",
)


def greedy(loaded, tokenizer, text: str, tokens: int) -> tuple[list[int], np.ndarray]:
    """Greedy ids of `text` and the first step's logits [V], through the paged forward."""
    from tests.paged import PagedDriver

    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=64)
    feed, ids, first = tokenizer.encode(text), [], None
    for _ in range(tokens):
        logits = np.asarray(driver.step({"r": feed})["r"], np.float32)
        first = logits if first is None else first
        feed = [int(np.argmax(logits[: tokenizer.vocab_size]))]
        ids += feed
    return ids, first


def parity(device_kind: str, tokens: int) -> list[dict]:
    import jax

    from tgix.models import load_model
    from tgix.sharding import make_mesh
    from tgix.tokenizer import load_tokenizer

    cpu = make_mesh(devices=jax.devices("cpu"))
    accel = make_mesh(devices=jax.devices(device_kind))
    reference = load_model(None, mesh=cpu, dtype="float32")
    tested = load_model(None, mesh=accel, dtype="bfloat16")
    tokenizer = load_tokenizer(reference.files)
    out = []
    for text in PROMPTS:
        want, want_logits = greedy(reference, tokenizer, text, tokens)
        got, got_logits = greedy(tested, tokenizer, text, tokens)
        same = next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), tokens)
        out.append({
            "prompt": text,
            "tokens_equal_before_divergence": same,
            "of": tokens,
            "first_step_max_logit_diff": float(np.abs(want_logits - got_logits).max()),
            "first_step_argmax_equal": int(want_logits.argmax()) == int(got_logits.argmax()),
        })  # fmt: skip
        print(f"  {text!r}: {same}/{tokens} equal, first-step max |dlogit| "
              f"{out[-1]['first_step_max_logit_diff']:.3f}", flush=True)  # fmt: skip
    return out


def throughput(batches, new_tokens: int) -> list[dict]:
    """benchmarks.engine's decode measurement (steady phase) with a bfloat16 LLM."""
    from types import SimpleNamespace

    from benchmarks.engine import decode_run
    from benchmarks.harness import random_prompt, run_batch
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    llm = LLM(
        None,
        dtype="bfloat16",
        limits=LimitRequest(max_batch_total_tokens=65536, max_batch_size=max(batches)),
        options=EngineOptions(progress=False),
    )
    settings = SimpleNamespace(prompt_tokens=32, new_tokens=new_tokens)
    out = []
    try:
        for batch in batches:
            run_batch(llm, [random_prompt(np.random.default_rng(0), 32)] * batch, 4)  # warm
            out.append({"batch": batch, **decode_run(llm, batch, settings, seed=batch)})
            print(f"  batch {batch}: {out[-1]['decode_tok_s']:.0f} tok/s decode", flush=True)
    finally:
        llm.engine.shutdown()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="gpu", help="jax platform under test (gpu, tpu)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--no-throughput", action="store_true", help="parity only")
    parser.add_argument("--no-quant", action="store_true", help="skip benchmarks.gpu_quant")
    parser.add_argument("--quant-layers", type=int, default=8, help="8B-shaped layers")
    parser.add_argument("--no-moe", action="store_true", help="skip benchmarks.gpu_moe")
    parser.add_argument("--no-vision", action="store_true", help="skip the image encoder")
    parser.add_argument("--json", default="benchmarks/results/gpu_check.json")
    args = parser.parse_args(argv)
    import jax

    from benchmarks.harness import machine, write_json

    print(f"devices: {jax.devices(args.device)}")
    print("bf16 on the accelerator vs float32 on CPU, greedy:")
    checks = parity(args.device, args.tokens)
    rates = []
    if not args.no_throughput:
        print("decode throughput (bfloat16):")
        rates = throughput(args.batches, args.new_tokens)
    quant = []
    if not args.no_quant:
        from benchmarks import gpu_quant

        print(f"quantized decode, {args.quant_layers} Llama-3-8B-shaped layers (ms per step):")
        quant = gpu_quant.run("llama3-8b", args.quant_layers, args.batches, "bfloat16")
    moe = []
    if not args.no_moe:
        from benchmarks import gpu_moe

        print("one MoE layer per expert path (ms per call, bfloat16):")
        moe = gpu_moe.run(["mixtral", "qwen3-moe"], [1, 16, 256, 2048])
    vision = {}
    if not args.no_vision:
        from benchmarks.vision import encoder_only

        vision = encoder_only("bfloat16")
        print(f"SmolVLM-256M-shaped image encoder, 5 tiles, bfloat16: {vision['ms']:.1f} ms")
    write_json(args.json, {"machine": machine(), "args": vars(args), "parity": checks,
                           "throughput": rates, "quant": quant, "moe": moe,
                           "vision": vision})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
