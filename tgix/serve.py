"""`python -m tgix.serve`: TGI's launcher. For now it loads and checks the model and tokenizer.

The HTTP server and the engine loop land with the engine and server issues; until then this
command validates that a model loads (weights, config, tokenizer, chat template), prints a
one-line summary, and exits with status 3 to say that serving itself is not available yet.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

NOT_YET = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m tgix.serve", description=__doc__)
    p.add_argument(
        "--model-id",
        default=env("MODEL_ID"),
        help="folder, .gguf, or Hub id (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument("--revision", default=env("REVISION"))
    p.add_argument("--dtype", default=env("DTYPE"), choices=["float32", "bfloat16", "float16"])
    p.add_argument("--huggingface-hub-cache", default=env("HUGGINGFACE_HUB_CACHE"))
    p.add_argument("--tokenizer-config-path", default=env("TOKENIZER_CONFIG_PATH"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tgix import load_model, load_tokenizer

    start = time.perf_counter()
    loaded = load_model(
        args.model_id,
        revision=args.revision,
        dtype=args.dtype,
        cache_dir=args.huggingface_hub_cache,
        token=os.environ.get("HF_TOKEN"),
    )
    tokenizer = load_tokenizer(loaded.files, tokenizer_config_path=args.tokenizer_config_path)
    cfg = loaded.config
    print(
        f"loaded {loaded.files.path} in {time.perf_counter() - start:.1f}s: {cfg.model_type}, "
        f"{cfg.num_layers} layers, D={cfg.hidden_size}, N={cfg.num_heads}, K={cfg.num_kv_heads}, "
        f"V={cfg.vocab_size}, tokenizer {tokenizer.vocab_size} ids, "
        f"chat template {'yes' if tokenizer.chat_template else 'no'}"
    )
    print(
        "tgix: the HTTP server is not implemented yet (engine and server issues)", file=sys.stderr
    )
    return NOT_YET


if __name__ == "__main__":
    sys.exit(main())
