"""transformers `generate` on the default model's weights (torch float32, CPU): the peer baseline.

    python -m benchmarks.hf_reference [--batches 1 8 32] [--new-tokens 128] [--prompt-tokens 32]

The same GGUF tgix serves, dequantized by transformers to float32. Static batches of equal
prompt lengths (no padding), greedy (`do_sample=False`), `min_new_tokens = max_new_tokens` so
no row stops early. torch uses `torch.set_num_threads(os.cpu_count())`. For each batch B:
  e2e tok/s     B * N / t(N)            t(n) = median seconds of generate(max_new_tokens=n)
  decode tok/s  B * (N - 1) / (t(N) - t(1))   (the steady decode phase, prefill taken out)
Prefill tok/s at L tokens: L / t(1) of a single prompt of L tokens.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.harness import median, print_table, random_prompt


def load_reference():
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from tgix.models.hub import default_model_file

    torch.set_num_threads(os.cpu_count() or 1)
    transformers.logging.set_verbosity_error()
    path = default_model_file()
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()


def time_generate(model, prompts: Sequence[Sequence[int]], new_tokens: int) -> float:
    import torch

    ids = torch.tensor([list(p) for p in prompts])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=model.config.eos_token_id,
        )
    elapsed = time.perf_counter() - start
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate returned {out.shape[1] - ids.shape[1]} new tokens")
    return elapsed


def decode_rates(model, batch: int, prompt_tokens: int, new_tokens: int, repeats: int) -> dict:
    rng = np.random.default_rng(batch)
    prompts = [random_prompt(rng, prompt_tokens) for _ in range(batch)]
    time_generate(model, prompts, 2)  # warm-up: first call allocates
    t_one = median(time_generate(model, prompts, 1) for _ in range(max(repeats, 2)))
    t_all = median(time_generate(model, prompts, new_tokens) for _ in range(repeats))
    return {
        "batch": batch,
        "e2e_tok_s": batch * new_tokens / t_all,
        "decode_tok_s": batch * (new_tokens - 1) / (t_all - t_one),
        "generate_s": t_all,
        "first_token_s": t_one,
    }


def prefill_rate(model, length: int, repeats: int) -> dict:
    rng = np.random.default_rng(length)
    prompts = [[random_prompt(rng, length)] for _ in range(repeats + 1)]
    time_generate(model, prompts[0], 1)
    t = median(time_generate(model, p, 1) for p in prompts[1:])
    return {"tokens": length, "tok_s": length / t, "ttft_s": t}


def run(
    batches: Sequence[int],
    prompt_tokens: int,
    new_tokens: int,
    prefill_lengths: Sequence[int],
    repeats: int,
) -> dict:
    import torch

    model = load_reference()
    decode = [decode_rates(model, b, prompt_tokens, new_tokens, repeats) for b in batches]
    prefill = [prefill_rate(model, n, max(repeats, 3)) for n in prefill_lengths]
    return {"threads": torch.get_num_threads(), "decode": decode, "prefill": prefill}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prefill-lengths", type=int, nargs="*", default=[128, 512, 1024])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    res = run(args.batches, args.prompt_tokens, args.new_tokens, args.prefill_lengths, args.repeats)
    print_table(
        f"transformers generate ({res['threads']} threads)",
        ["batch", "decode tok/s", "e2e tok/s"],
        [[d["batch"], d["decode_tok_s"], d["e2e_tok_s"]] for d in res["decode"]],
    )
    print_table(
        "transformers prefill",
        ["tokens", "tok/s"],
        [[p["tokens"], p["tok_s"]] for p in res["prefill"]],
    )


if __name__ == "__main__":
    main()
