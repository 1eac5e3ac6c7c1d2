"""Generate text with the jitted, pure `tgix.generate` (no server, no engine).

    python examples/jit_generate.py                      # embedded SmolLM2-135M-Instruct GGUF
    python examples/jit_generate.py --model PATH --prompt "Once upon a time" --temperature 0.7

The model becomes (graphdef, params); the whole prefill + decode loop is one XLA program, so
the first call compiles and later calls with the same shapes (batch, padded prompt length,
max_new_tokens) reuse it whatever the prompt text, temperature or seed.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import tgix
from tgix.generation import jit_generate, split_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="folder, .gguf or Hub id (default: SmolLM2)")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    loaded = tgix.load_model(args.model)
    tokenizer = tgix.load_tokenizer(loaded.files)
    graphdef, params = split_model(loaded.model)
    print(f"loaded {loaded.files.path.name} in {time.perf_counter() - start:.1f}s")

    text = args.prompt
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    prompt = tokenizer.encode(text)
    prompt_ids = jnp.asarray([prompt], jnp.int32)  # [B=1, T]
    prompt_lens = jnp.asarray([len(prompt)], jnp.int32)  # [B]

    def run():
        out = jit_generate(
            graphdef,
            params,
            prompt_ids,
            prompt_lens,
            max_new_tokens=args.max_new_tokens,
            eos_id=list(tokenizer.eos_token_ids) or None,
            temperature=jnp.float32(args.temperature),  # traced: no recompile per value
            top_k=args.top_k,
            key=jax.random.key(args.seed),
        )
        return jax.block_until_ready(out)

    for label in ("first call (compiles)", "second call (cached)"):
        start = time.perf_counter()
        out = run()
        print(f"{label}: {time.perf_counter() - start:.2f}s")
    length = int(out.lengths[0])
    print(f"prompt ({len(prompt)} tokens): {args.prompt!r}")
    print(f"output ({length} tokens): {tokenizer.decode(out.tokens[0, :length].tolist())!r}")


if __name__ == "__main__":
    main()
