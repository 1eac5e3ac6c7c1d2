"""Vision-language models against transformers (issue 19): the image encoder's time per image
and the time to first token of a 1-image chat, tgix and transformers on the same random
weights in the same run, float32 on CPU.

    python -m benchmarks.vision [--repeats 5] [--longest-edge 1024] [--json out.json]

The checkpoint is SmolVLM-256M-Instruct's shape (SigLIP-like tower: width 768, 12 layers,
12 heads, 16-pixel patches on 512-pixel tiles, pixel-shuffle 4 -> 64 tokens a tile;
decoder: SmolLM2-135M's) with random weights and the test tokenizer, written with
transformers' own class. The processor's longest edge (`--longest-edge`, the real model's
is 2048) sets how many tiles one image becomes: 1024 -> 2 x 2 tiles + the global one.

- encoder: tgix's compiled ImageEncoder (tgix/models/vision/encoder.py) and transformers'
  `get_image_features` (its default attention, sdpa) on the same processed pixels.
- TTFT: processor + encoder + prefill until the first token: tgix through the engine
  (`VisionPrompts.prepare`, then `engine.submit`, first event), transformers
  `processor(...)` then `generate(max_new_tokens=1)`.
Medians over `--repeats`, each side warmed up once first.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from benchmarks import harness
from benchmarks.harness import median, print_table, ratio

VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
          "num_attention_heads": 12, "patch_size": 16, "image_size": 512}  # fmt: skip
TEXT = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "max_position_embeddings": 8192}  # fmt: skip
SCALE_FACTOR = 4


def image(seed: int, size=(768, 1024)):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def measure(folder: str, args) -> dict:
    import torch
    from transformers import AutoModelForImageTextToText

    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    limits = LimitRequest(max_total_tokens=512, max_batch_prefill_tokens=512,
                          max_batch_total_tokens=2048, max_batch_size=2)  # fmt: skip
    start = time.perf_counter()
    llm = LLM(folder, limits=limits, options=EngineOptions(progress=False))
    construct = time.perf_counter() - start
    vision = llm.engine.vision
    reference = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    torch.set_num_threads(2)
    parts = [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]
    prompt = llm.chat_prompt([{"role": "user", "content": parts}])
    out = {"construct_s": construct, "tgix": {"encode": [], "ttft": []},
           "transformers": {"encode": [], "ttft": []}}  # fmt: skip
    try:
        for i in range(args.repeats + 1):  # the first of each is a warm-up
            picture = image(seed=i)
            batch = vision.processor(text=[prompt], images=[[picture]], return_tensors="np")
            pixels = {k: batch[k][0] for k in ("pixel_values", "pixel_attention_mask")}
            out["tiles"] = int(pixels["pixel_values"].shape[0])
            out["prompt_tokens"] = int(batch["input_ids"].shape[1])
            t0 = time.perf_counter()
            vision.encode(pixels)
            t1 = time.perf_counter()
            with torch.no_grad():
                reference.get_image_features(
                    torch.from_numpy(batch["pixel_values"]),
                    torch.from_numpy(batch["pixel_attention_mask"]),
                )
            t2 = time.perf_counter()
            first = _tgix_ttft(llm, vision, prompt, picture)
            t3 = time.perf_counter()
            with torch.no_grad():
                inputs = vision.processor(text=[prompt], images=[[picture]], return_tensors="pt")
                reference.generate(**inputs, max_new_tokens=1, do_sample=False)
            t4 = time.perf_counter()
            if i:
                out["tgix"]["encode"].append(t1 - t0)
                out["transformers"]["encode"].append(t2 - t1)
                out["tgix"]["ttft"].append(first)
                out["transformers"]["ttft"].append(t4 - t3)
    finally:
        llm.close()
    return out


def _tgix_ttft(llm, vision, prompt, picture) -> float:
    from tgix.engine.request import GenerationRequest

    start = time.perf_counter()
    ids, spans = vision.prepare(prompt, [picture])
    stream = llm.engine.submit(GenerationRequest(prompt_ids=ids, max_new_tokens=1, images=spans))
    next(iter(stream))
    elapsed = time.perf_counter() - start
    for _ in stream:
        pass
    return elapsed


def encoder_only(dtype: str = "bfloat16", tiles: int = 5, repeats: int = 3, vision=None) -> dict:
    """tgix's compiled tower alone on the default device (gpu_check's vision step): random
    weights at SmolVLM-256M's shape, `tiles` tiles, ms per call (median of `repeats`)."""
    import jax.numpy as jnp
    from flax import nnx

    from tgix.models.vision.encoder import ImageEncoder
    from tgix.models.vision.idefics3 import Idefics3Vision, Idefics3VisionConfig

    cfg = Idefics3VisionConfig.from_hf({
        "model_type": "idefics3", "vision_config": {**VISION, **(vision or {})},
        "scale_factor": SCALE_FACTOR, "text_config": TEXT,
    })  # fmt: skip
    encoder = ImageEncoder(Idefics3Vision(cfg, rngs=nnx.Rngs(0), dtype=jnp.dtype(dtype)))
    start = time.perf_counter()
    encoder.compile_all()
    compile_s = time.perf_counter() - start
    size = cfg.image_size
    pixels = {"pixel_values": np.random.default_rng(0).random((tiles, 3, size, size), np.float32)}
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        encoder(pixels)
        times.append(time.perf_counter() - t0)
    ms = median(times[1:]) * 1e3
    return {
        "dtype": dtype,
        "tiles": tiles,
        "compile_s": compile_s,
        "ms": ms,
        "ms_per_tile": ms / tiles,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--longest-edge", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from tgix.testing_vlm import write_tiny_idefics3

    with tempfile.TemporaryDirectory() as folder:
        write_tiny_idefics3(
            folder, vision=VISION, text=TEXT, scale_factor=SCALE_FACTOR,
            longest_edge=args.longest_edge,
        )  # fmt: skip
        result = measure(folder, args)
    rows = []
    for what, unit in (("encode", "encoder per image"), ("ttft", "TTFT, 1-image chat")):
        ours, theirs = median(result["tgix"][what]), median(result["transformers"][what])
        rows.append([unit, f"{ours * 1e3:.0f} ms", f"{theirs * 1e3:.0f} ms", ratio(theirs, ours)])
    title = (
        f"SmolVLM-256M shape, random weights; {result['tiles']} tiles an image, "
        f"{result['prompt_tokens']} prompt tokens; medians of {args.repeats}"
    )
    print_table(title, ["", "tgix", "transformers", "speed-up"], rows)
    harness.write_json(args.json, {"machine": harness.machine(), **result})


if __name__ == "__main__":
    main()
