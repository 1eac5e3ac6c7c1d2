"""Quantized decode on an accelerator: bf16 against int8 (eetq) and 4-bit (nf4, kept) linear
layers on a random model of Llama-3-8B's layer shape, as one part of benchmarks.gpu_check.

    python -m benchmarks.gpu_quant [--layers 8] [--rows 1 8 32] [--json PATH]
    python -m benchmarks.gpu_quant --shape tiny --layers 2 --rows 1 2   # CPU smoke test

Random weights come from a TensorSource that draws each tensor on the host as the loader asks
for it (no checkpoint on disk), so the loader quantizes and places them exactly as it would a
real checkpoint's. `--layers` of the 32 keep the run inside the device budget; ms per layer
scale to the whole model. Per mode: weight bytes on the device and the median ms of a decode
step (tests.paged.PagedDriver: R rows of one token over 64 cached positions each).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512),
}  # fmt: skip


class RandomSource:
    """HF tensor names of a Llama checkpoint, each read as fresh N(0, 1/fan_in) values."""

    def __init__(self, hf: dict, seed: int = 0):
        self.hf, self.rng = hf, np.random.default_rng(seed)
        d, f = hf["hidden_size"], hf["intermediate_size"]
        n, k, h = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
        vocab = hf["vocab_size"]
        self.shapes = {
            "model.embed_tokens.weight": (vocab, d),
            "model.norm.weight": (d,),
            "lm_head.weight": (vocab, d),
        }
        linear = {
            "self_attn.q_proj": (n * h, d), "self_attn.k_proj": (k * h, d),
            "self_attn.v_proj": (k * h, d), "self_attn.o_proj": (d, n * h),
            "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f),
        }  # fmt: skip
        for i in range(hf["num_hidden_layers"]):
            p = f"model.layers.{i}."
            self.shapes[p + "input_layernorm.weight"] = (d,)
            self.shapes[p + "post_attention_layernorm.weight"] = (d,)
            self.shapes |= {f"{p}{name}.weight": shape for name, shape in linear.items()}

    def names(self) -> list[str]:
        return list(self.shapes)

    def read(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        return (self.rng.standard_normal(shape, np.float32) / np.sqrt(shape[-1])).astype(np.float32)


def step_ms(loaded, rows: int, repeats: int = 10) -> float:
    from tests.paged import PagedDriver

    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=16,
                         num_pages=8 * rows + 2, pages_per_row=8)  # fmt: skip
    prompts = {f"r{i}": list(range(3, 67)) for i in range(rows)}
    driver.step(prompts, num_tokens=64 * rows)
    times = []
    for _ in range(repeats + 2):
        start = time.perf_counter()
        driver.step({r: [5] for r in prompts})
        times.append(time.perf_counter() - start)
    return float(np.median(times[2:]) * 1e3)


def build(hf: dict, mode: str | None, dtype):
    import dataclasses

    import jax.numpy as jnp

    from tgix.models import LoadedModel, build_model
    from tgix.models.config import ModelConfig
    from tgix.models.hub import ModelFiles
    from tgix.models.quant import quantize_abstract
    from tgix.models.quant_group import CODEBOOK_METHODS, codebook_abstract
    from tgix.models.weights import load_weights
    from tgix.sharding import make_mesh

    cfg = ModelConfig.from_hf(hf)
    abstract = build_model(cfg, dtype=jnp.dtype(dtype), abstract=True)
    if mode in CODEBOOK_METHODS:
        abstract = codebook_abstract(abstract, mode)
    elif mode is not None:
        abstract = quantize_abstract(abstract, mode)
    mesh = make_mesh(model=1)
    model = load_weights(abstract, cfg, RandomSource(hf), mesh, jnp.dtype(dtype), quantize=mode)
    files = ModelFiles(kind="safetensors", path=None)
    return dataclasses.replace(LoadedModel(model, cfg, files, mesh), quantize=mode)


def run(shape: str, layers: int, rows, dtype: str) -> list[dict]:
    hf = {"model_type": "llama", "num_hidden_layers": layers, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 8192, "rope_theta": 500000.0,
          "tie_word_embeddings": False, **SHAPES[shape]}  # fmt: skip
    out = []
    for mode in (None, "eetq", "bitsandbytes-nf4"):
        start = time.perf_counter()
        loaded = build(hf, mode, dtype)
        row = {"mode": mode or dtype, "load_s": time.perf_counter() - start,
               "weight_gib": loaded.weight_bytes / 2**30}  # fmt: skip
        for r in rows:
            row[f"step_ms_{r}"] = step_ms(loaded, r)
        print("  " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()), flush=True)  # fmt: skip
        out.append(row)
        del loaded
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", default="benchmarks/results/gpu_quant.json")
    args = parser.parse_args(argv)
    from benchmarks.harness import machine, write_json

    results = run(args.shape, args.layers, args.rows, args.dtype)
    write_json(args.json, {"machine": machine(), "args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
