"""Checkpoint tensors -> model parameters placed on a mesh, with completeness checks.

One table maps transformers names to parameter paths plus a transform (transpose, head split).
Each tensor is read, transformed, cast and `device_put` straight to its NamedSharding, one at a
time, so the host never holds a second full copy of the model. Afterwards every parameter must
have been set exactly once and every checkpoint tensor used or explicitly ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tgix.models.checkpoint import CheckpointError, TensorSource
from tgix.models.config import ModelConfig
from tgix.models.quant import quantize_rows
from tgix.models.quant_group import (
    CODEBOOK_METHODS,
    GroupedWeight,
    GroupLayout,
    quantize_codebook,
)
from tgix.sharding.rules import sharding_for

Transform = Callable[[np.ndarray], np.ndarray]
Path = tuple[str | int, ...]

# Tensors transformers may save that carry no parameters of ours.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq|.*\.masked_bias|.*\.attn\.bias")


def _weight_table(
    cfg: ModelConfig, kv_repeats: int = 1
) -> list[tuple[re.Pattern, Callable[[re.Match], Path], Transform]]:
    """(name pattern, parameter path, transform) rows; HF linear weights are [out, in].
    `kv_repeats` > 1 repeats each KV head in place (head j of the result is head
    j // kv_repeats of the checkpoint), so query head n still reads its own KV head."""
    d, k, h = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
    ident: Transform = lambda w: w
    kv_heads: Transform = lambda w: np.repeat(w, kv_repeats, axis=-2) if kv_repeats > 1 else w
    transpose: Transform = lambda w: w.T
    layer = r"model\.layers\.(\d+)\."

    def at(*tail: str) -> Callable[[re.Match], Path]:
        return lambda m: ("layers", int(m.group(1)), *tail)

    rows = [
        (r"model\.embed_tokens\.weight", lambda m: ("embed_tokens", "embedding"), ident),
        (r"model\.norm\.weight", lambda m: ("norm", "weight"), ident),
        (layer + r"input_layernorm\.weight", at("input_layernorm", "weight"), ident),
        (
            layer + r"post_attention_layernorm\.weight",
            at("post_attention_layernorm", "weight"),
            ident,
        ),
        (
            layer + r"self_attn\.q_proj\.weight",
            at("self_attn", "q_proj", "kernel"),
            transpose,  # [D, N*H]
        ),
        (
            layer + r"self_attn\.k_proj\.weight",
            at("self_attn", "k_proj", "kernel"),
            lambda w: kv_heads(w.T.reshape(d, k, h)).reshape(d, -1),  # [D, K*H]
        ),
        (
            layer + r"self_attn\.v_proj\.weight",
            at("self_attn", "v_proj", "kernel"),
            lambda w: kv_heads(w.T.reshape(d, k, h)).reshape(d, -1),
        ),
        (layer + r"self_attn\.o_proj\.weight", at("self_attn", "o_proj", "kernel"), transpose),
        (layer + r"self_attn\.q_proj\.bias", at("self_attn", "q_proj", "bias"), ident),
        (
            layer + r"self_attn\.k_proj\.bias",
            at("self_attn", "k_proj", "bias"),
            lambda b: kv_heads(b.reshape(k, h)).reshape(-1),
        ),
        (
            layer + r"self_attn\.v_proj\.bias",
            at("self_attn", "v_proj", "bias"),
            lambda b: kv_heads(b.reshape(k, h)).reshape(-1),
        ),
        (layer + r"self_attn\.o_proj\.bias", at("self_attn", "o_proj", "bias"), ident),
        (layer + r"self_attn\.q_norm\.weight", at("self_attn", "q_norm", "weight"), ident),
        (layer + r"self_attn\.k_norm\.weight", at("self_attn", "k_norm", "weight"), ident),
    ]
    for proj in ("gate_proj", "up_proj", "down_proj"):
        rows.append((layer + rf"mlp\.{proj}\.weight", at("mlp", proj, "kernel"), transpose))
        rows.append((layer + rf"mlp\.{proj}\.bias", at("mlp", proj, "bias"), ident))
    if not cfg.tie_word_embeddings:
        rows.append((r"lm_head\.weight", lambda m: ("lm_head", "weight"), ident))
    return [(re.compile(pattern), path, transform) for pattern, path, transform in rows]


def _match(table, name: str) -> tuple[Path, Transform] | None:
    for pattern, path_of, transform in table:
        m = pattern.fullmatch(name)
        if m:
            return path_of(m), transform
    return None


def grouped_layouts(cfg: ModelConfig, source) -> dict[Path, GroupLayout]:
    """Module path -> GroupLayout of every layer `source` (prequant.PrequantizedSource) keeps
    quantized, so quant_group.group_abstract can shape the model before any tensor is read."""
    layouts, table = {}, _weight_table(cfg)
    for name in source.names():
        layout = source.layout(name)
        hit = _match(table, name) if layout is not None else None
        if hit is not None and hit[0][-1] == "kernel":
            layouts[hit[0][:-1]] = layout
    return layouts


def load_weights(
    model_abstract: nnx.Module,
    cfg: ModelConfig,
    source: TensorSource,
    mesh: Mesh,
    dtype,
    *,
    kv_repeats: int = 1,
    quantize: str | None = None,
) -> nnx.Module:
    """Fill an abstract model (from `nnx.eval_shape`) with checkpoint tensors on `mesh`.
    `cfg` is the checkpoint's config; `kv_repeats` copies of each KV head are placed.
    With `quantize` (a tgix/models/quant.py method; the abstract model already quantized by
    quant.quantize_abstract), each linear kernel is quantized on the host, per output
    channel, and placed as its codes and scale; a 4-bit codebook method (quant_group.
    CODEBOOK_METHODS, the model from codebook_abstract) quantizes it per block of inputs.
    A source may also hand a quant_group.GroupedWeight (pre-quantized, kept): it is placed
    as its arrays, the kernel transform applied to its output channels as a row map.

    Raises CheckpointError naming the tensor on: an unexpected tensor, a shape mismatch, a
    tensor set twice, or a parameter the checkpoint lacks.
    """
    graphdef, state = nnx.split(model_abstract)
    expected: dict[Path, nnx.Variable] = dict(nnx.to_flat_state(state))
    table = _weight_table(cfg, kv_repeats)
    loaded: dict[Path, nnx.Variable] = {}
    row_maps: dict[tuple, np.ndarray] = {}  # (transform, N, K) -> rows: one per layer kind
    for name in source.names():
        hit = _match(table, name)
        if hit is None:
            if _IGNORED.fullmatch(name) or (cfg.tie_word_embeddings and name == "lm_head.weight"):
                continue
            raise CheckpointError(
                f"unexpected tensor {name!r}: no parameter of {cfg.model_type} uses it"
            )
        path, transform = hit
        raw = source.read(name)
        if isinstance(raw, GroupedWeight):  # a pre-quantized layer kept quantized
            key = (transform, *raw.shape)
            if key not in row_maps:
                row_maps[key] = _row_map(transform, *raw.shape)
            weight = raw.take_rows(row_maps[key])
            _place_grouped(name, weight, path[:-1], expected, loaded, mesh)
            continue
        if quantize in CODEBOOK_METHODS and path[-1] == "kernel":  # 4-bit at load time
            module = path[:-1]
            if module + ("scale",) not in expected:
                raise CheckpointError(f"tensor {name!r}: {'.'.join(map(str, module))} is not 4-bit")
            w = np.asarray(transform(raw), np.float32).T  # [N, K]
            group = w.shape[1] // expected[module + ("scale",)].shape[1]
            weight = quantize_codebook(w, CODEBOOK_METHODS[quantize], group)
            _place_grouped(name, weight, module, expected, loaded, mesh)
            continue
        if quantize and path[-1] == "kernel" and path[:-1] + ("codes",) in expected:
            path = path[:-1] + ("codes",)
        if path not in expected:
            raise CheckpointError(
                f"unexpected tensor {name!r}: this config has no {'.'.join(map(str, path))}"
            )
        if path in loaded:
            raise CheckpointError(f"tensor {name!r} is set twice")
        var = expected[path]
        try:
            value = transform(raw)
        except ValueError as e:
            raise CheckpointError(
                f"tensor {name!r} has shape {raw.shape}, cannot fit {var.shape}"
            ) from e
        if path[-1] == "codes":
            value = value.T  # the kernel [K, N] -> [N, K], as codes are laid out
        if value.shape != tuple(var.shape):
            raise CheckpointError(
                f"tensor {name!r} has shape {raw.shape}; expected one mapping to {tuple(var.shape)}"
            )
        if path[-1] == "codes":
            codes, scale = quantize_rows(value, quantize)
            scale_path = path[:-1] + ("scale",)
            loaded[path] = _place(var, codes, mesh)
            loaded[scale_path] = _place(expected[scale_path], scale, mesh)
            del raw, value, codes, scale
            continue
        loaded[path] = _place(var, np.ascontiguousarray(value, dtype=dtype), mesh)
        del raw, value
    missing = [".".join(map(str, p)) for p in expected if p not in loaded]
    if missing:
        raise CheckpointError(
            f"checkpoint lacks {len(missing)} tensor(s): {', '.join(missing[:8])}"
        )
    return nnx.merge(graphdef, nnx.from_flat_state(list(loaded.items())))


def _row_map(transform: Transform, n: int, k: int) -> np.ndarray:
    """The output channels a kernel transform picks: rows with transform(w).T == w[rows] for
    every w [N, K] (identity, a KV head repeat, a row permutation), found by transforming the
    row index itself; a transform that mixes inputs is not a row map and is refused."""
    index = np.broadcast_to(np.arange(n, dtype=np.int32)[:, None], (n, k))
    mapped = np.asarray(transform(index)).T  # [N', K]
    rows = mapped[:, 0]
    if not (mapped == rows[:, None]).all():
        raise CheckpointError("a quantized layer's transform mixes its input channels")
    return rows


def _place_grouped(name, weight: GroupedWeight, module: Path, expected, loaded, mesh):
    """Place a GroupedWeight's arrays (quant_group.GroupedWeight.device_arrays) as the grouped
    Dense at `module`."""
    for part, host in weight.device_arrays().items():
        path = module + (part,)
        if path not in expected:
            raise CheckpointError(
                f"tensor {name!r} is quantized, but {'.'.join(map(str, module))} is not a "
                f"grouped layer with {part}"
            )
        if path in loaded:
            raise CheckpointError(f"tensor {name!r} is set twice")
        var = expected[path]
        if host.shape != tuple(var.shape):
            raise CheckpointError(f"tensor {name!r}: its {part} is {host.shape}, not {var.shape}")
        loaded[path] = _place(var, host, mesh)


def _place(var: nnx.Variable, host: np.ndarray, mesh: Mesh) -> nnx.Variable:
    """The variable with `host` on the mesh, laid out by its logical axes."""
    return var.replace(jax.device_put(host, sharding_for(mesh, var.axes, host.shape)))
