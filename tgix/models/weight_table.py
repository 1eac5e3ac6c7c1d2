"""Weight tables: checkpoint tensor names -> parameter paths and the transform between them.

A Row is a name pattern and its Targets. One target is the usual case; several split a fused
tensor (Phi-3's qkv_proj into q, k and v); a `stacked` target puts each of many tensors at
its index of one parameter's axis 0 (experts 0..E-1 into an [E, ...] array). Paths may hold
"{layer}", the pattern's first group. HF linear weights are [out, in]; kernels are [in, out].
`decoder_rows` is the Llama-shaped decoder every family starts from
(tgix/models/families/).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tgix.models.config import ModelConfig

Transform = Callable[[np.ndarray], np.ndarray]
Path = tuple[str | int, ...]
LAYER = r"model\.layers\.(\d+)\."
NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def ident(w: np.ndarray) -> np.ndarray:
    return w


def transpose(w: np.ndarray) -> np.ndarray:
    return w.T


class Target(NamedTuple):
    path: Path  # "{layer}" stands for the pattern's first group
    transform: Transform = ident
    stacked: bool = False  # the pattern's last group is the index on the parameter's axis 0


class Row(NamedTuple):
    pattern: re.Pattern
    targets: tuple[Target, ...]


def row(pattern: str, *targets: Target) -> Row:
    return Row(re.compile(pattern), targets)


def layer(*tail: str | int) -> Path:
    return ("layers", "{layer}", *tail)


def match(table: list[Row], name: str) -> list[tuple[Path, Transform, int | None]] | None:
    """(parameter path, transform, stacked index or None) per target of `name`'s row."""
    for r in table:
        m = r.pattern.fullmatch(name)
        if m:
            return [_resolve(t, m) for t in r.targets]
    return None


def _resolve(target: Target, m: re.Match) -> tuple[Path, Transform, int | None]:
    path = tuple(int(m.group(1)) if p == "{layer}" else p for p in target.path)
    return path, target.transform, int(m.groups()[-1]) if target.stacked else None


def kv_heads_transform(cfg: ModelConfig, kv_repeats: int) -> Transform:
    """[K*H, D] (HF k or v weight) -> kernel [D, K*R*H]: each KV head repeated `kv_repeats`
    times in place (head j of the result is head j // R), so query head n still reads its
    own KV head; a bias [K*H] -> [K*R*H]."""
    k, h = cfg.num_kv_heads, cfg.head_dim

    def apply(w: np.ndarray) -> np.ndarray:
        if w.ndim == 1:
            b = w.reshape(k, h)
            return (np.repeat(b, kv_repeats, axis=0) if kv_repeats > 1 else b).reshape(-1)
        kernel = w.T.reshape(w.shape[1], k, h)
        kernel = np.repeat(kernel, kv_repeats, axis=1) if kv_repeats > 1 else kernel
        return kernel.reshape(w.shape[1], -1)

    return apply


def decoder_rows(cfg: ModelConfig, kv_repeats: int = 1, *, mlp: bool = True) -> list[Row]:
    """Embeddings, norms, attention (q/k/v/o, biases, q/k norms), the dense gated MLP
    (unless `mlp` is False) and an untied LM head, under transformers' Llama names."""
    kv = kv_heads_transform(cfg, kv_repeats)
    attn = LAYER + r"self_attn\."
    rows = [
        row(r"model\.embed_tokens\.weight", Target(("embed_tokens", "embedding"))),
        row(r"model\.norm\.weight", Target(("norm", "weight"))),
        *(row(LAYER + rf"{n}\.weight", Target(layer(n, "weight"))) for n in NORMS),
        row(attn + r"q_proj\.weight", Target(layer("self_attn", "q_proj", "kernel"), transpose)),
        row(attn + r"k_proj\.weight", Target(layer("self_attn", "k_proj", "kernel"), kv)),
        row(attn + r"v_proj\.weight", Target(layer("self_attn", "v_proj", "kernel"), kv)),
        row(attn + r"o_proj\.weight", Target(layer("self_attn", "o_proj", "kernel"), transpose)),
        row(attn + r"q_proj\.bias", Target(layer("self_attn", "q_proj", "bias"))),
        row(attn + r"k_proj\.bias", Target(layer("self_attn", "k_proj", "bias"), kv)),
        row(attn + r"v_proj\.bias", Target(layer("self_attn", "v_proj", "bias"), kv)),
        row(attn + r"o_proj\.bias", Target(layer("self_attn", "o_proj", "bias"))),
        row(attn + r"q_norm\.weight", Target(layer("self_attn", "q_norm", "weight"))),
        row(attn + r"k_norm\.weight", Target(layer("self_attn", "k_norm", "weight"))),
    ]
    if mlp:
        rows += mlp_rows(LAYER + r"mlp\.", ("mlp",))
    if not cfg.tie_word_embeddings:
        rows.append(row(r"lm_head\.weight", Target(("lm_head", "weight"))))
    return rows


def mlp_rows(prefix: str, module: tuple[str, ...]) -> list[Row]:
    """gate/up/down projections (and biases) of a gated MLP at `prefix` -> layer(*module)."""
    rows = []
    for proj in ("gate_proj", "up_proj", "down_proj"):
        kernel = Target(layer(*module, proj, "kernel"), transpose)
        rows.append(row(prefix + rf"{proj}\.weight", kernel))
        rows.append(row(prefix + rf"{proj}\.bias", Target(layer(*module, proj, "bias"))))
    return rows
