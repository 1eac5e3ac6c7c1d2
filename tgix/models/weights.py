"""Checkpoint tensors -> model parameters placed on a mesh, with completeness checks.

One table maps transformers names to parameter paths plus a transform (transpose, head split).
Each tensor is read, transformed, cast and `device_put` straight to its NamedSharding, one at a
time, so the host never holds a second full copy of the model. Afterwards every parameter must
have been set exactly once and every checkpoint tensor used or explicitly ignored.
"""

from __future__ import annotations

import re

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tgix.models import cpu_int8
from tgix.models.checkpoint import CheckpointError, TensorSource
from tgix.models.config import ModelConfig
from tgix.models.families import family_of
from tgix.models.quant import quantize_rows
from tgix.models.quant_group import (
    CODEBOOK_METHODS,
    GroupedWeight,
    GroupLayout,
    quantize_codebook,
)
from tgix.models.weight_table import Path, Row, Transform, match
from tgix.sharding.rules import sharding_for

# Tensors transformers may save that carry no parameters of ours.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq|.*\.masked_bias|.*\.attn\.bias")


def weight_table(cfg: ModelConfig, kv_repeats: int = 1) -> list[Row]:
    """The checkpoint's family table (tgix/models/families/, weight_table.py rows)."""
    return family_of(cfg.model_type).rows(cfg, kv_repeats)


def grouped_layouts(cfg: ModelConfig, source) -> dict[Path, GroupLayout]:
    """Module path -> GroupLayout of every layer `source` (prequant.PrequantizedSource) keeps
    quantized, so quant_group.group_abstract can shape the model before any tensor is read."""
    layouts, table = {}, weight_table(cfg)
    for name in source.names():
        layout = source.layout(name)
        for path, _, index in (match(table, name) or []) if layout is not None else []:
            if path[-1] == "kernel" and index is None:
                layouts[path[:-1]] = layout
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
    channel, and placed as its codes (packed by cpu_int8.pack where the abstract codes are
    uint8: the native CPU kernel's layout) and scale; a 4-bit codebook method (quant_group.
    CODEBOOK_METHODS, the model from codebook_abstract) quantizes it per block of inputs.
    An out-major float Dense (out_major.out_major_abstract) gets the kernel transposed.
    A source may also hand a quant_group.GroupedWeight (pre-quantized, kept): it is placed
    as its arrays, the kernel transform applied to its output channels as a row map.
    Stacked targets (experts) fill one host array each, placed once its last index is in.

    Raises CheckpointError naming the tensor on: an unexpected tensor, a shape mismatch, a
    tensor set twice, or a parameter the checkpoint lacks.
    """
    graphdef, state = nnx.split(model_abstract)
    placer = _Placer(dict(nnx.to_flat_state(state)), mesh, dtype, quantize)
    table = weight_table(cfg, kv_repeats)
    for name in source.names():
        targets = match(table, name)
        if targets is None:
            if _IGNORED.fullmatch(name) or (cfg.tie_word_embeddings and name == "lm_head.weight"):
                continue
            raise CheckpointError(
                f"unexpected tensor {name!r}: no parameter of {cfg.model_type} uses it"
            )
        raw = source.read(name)
        for path, transform, index in targets:
            if index is not None:
                placer.stack(name, raw, path, transform, index)
            else:
                placer.put(name, raw, path, transform)
        del raw
    return nnx.merge(graphdef, nnx.from_flat_state(list(placer.finish().items())))


class _Placer:
    """The parameters placed so far (`loaded`), against the abstract model's (`expected`)."""

    def __init__(self, expected: dict[Path, nnx.Variable], mesh: Mesh, dtype, quantize):
        self.expected, self.mesh, self.dtype, self.quantize = expected, mesh, dtype, quantize
        self.loaded: dict[Path, nnx.Variable] = {}
        self.row_maps: dict[tuple, np.ndarray] = {}  # (transform, N, K) -> rows, per kind
        # stacked path -> (host array, indices set); the array None once placed
        self.stacks: dict[Path, tuple[np.ndarray | None, set[int]]] = {}

    def put(self, name: str, raw, path: Path, transform: Transform) -> None:
        expected, quantize = self.expected, self.quantize
        if isinstance(raw, GroupedWeight):  # a pre-quantized layer kept quantized
            key = (transform, *raw.shape)
            if key not in self.row_maps:
                self.row_maps[key] = _row_map(transform, *raw.shape)
            self._grouped(name, raw.take_rows(self.row_maps[key]), path[:-1])
            return
        if quantize in CODEBOOK_METHODS and path[-1] == "kernel":  # 4-bit at load time
            module = path[:-1]
            if module + ("scale",) not in expected:
                raise CheckpointError(f"tensor {name!r}: {'.'.join(map(str, module))} is not 4-bit")
            w = np.asarray(transform(raw), np.float32).T  # [N, K]
            group = w.shape[1] // expected[module + ("scale",)].shape[1]
            self._grouped(name, quantize_codebook(w, CODEBOOK_METHODS[quantize], group), module)
            return
        # a Dense kernel [K, N] placed as codes or as out_major.py's weight, both [N, K]
        leaf = "codes" if quantize else "weight"
        out_major = path[-1] == "kernel" and path[:-1] + (leaf,) in expected
        if out_major:
            path = path[:-1] + (leaf,)
        var = self._slot(name, path)
        try:
            value = transform(raw)
        except ValueError as e:
            raise CheckpointError(
                f"tensor {name!r} has shape {raw.shape}, cannot fit {var.shape}"
            ) from e
        if out_major:
            value = value.T
        packed = path[-1] == "codes" and var.dtype == np.uint8  # cpu_int8.pack's layout
        shape = cpu_int8.packed_shape(*value.shape) if packed and value.ndim == 2 else value.shape
        if shape != tuple(var.shape):
            raise CheckpointError(
                f"tensor {name!r} has shape {raw.shape}; expected one mapping to {tuple(var.shape)}"
            )
        if path[-1] == "codes":
            codes, scale = quantize_rows(value, quantize)
            scale_path = path[:-1] + ("scale",)
            self.loaded[path] = _place(var, cpu_int8.pack(codes) if packed else codes, self.mesh)
            self.loaded[scale_path] = _place(expected[scale_path], scale, self.mesh)
            return
        self.loaded[path] = _place(var, np.ascontiguousarray(value, dtype=self.dtype), self.mesh)

    def stack(self, name: str, raw, path: Path, transform: Transform, index: int) -> None:
        """`raw` (transformed) at `index` of the stacked parameter at `path`."""
        if isinstance(raw, GroupedWeight):
            raise CheckpointError(f"tensor {name!r}: quantized experts are not supported")
        if path not in self.stacks:
            shape = self._slot(name, path).shape
            self.stacks[path] = (np.empty(shape, self.dtype), set())
        host, filled = self.stacks[path]
        if host is None or index in filled:  # None: placed, every index set already
            raise CheckpointError(f"tensor {name!r} is set twice")
        value = transform(raw)
        if not 0 <= index < host.shape[0]:
            raise CheckpointError(
                f"tensor {name!r}: index {index} is out of range for {host.shape[0]}"
            )
        if value.shape != host.shape[1:]:
            raise CheckpointError(
                f"tensor {name!r} has shape {raw.shape}; expected one mapping to {host.shape[1:]}"
            )
        host[index] = value
        filled.add(index)
        if len(filled) == host.shape[0]:
            self.loaded[path] = _place(self.expected[path], host, self.mesh)
            self.stacks[path] = (None, filled)  # the host copy is freed (no view kept)

    def finish(self) -> dict[Path, nnx.Variable]:
        missing = []
        for path, var in self.expected.items():
            if path in self.loaded:
                continue
            where = ".".join(map(str, path))
            if path in self.stacks:  # stacked, partly filled: name the indices missing
                gaps = sorted(set(range(var.shape[0])) - self.stacks[path][1])
                where += f"[{', '.join(map(str, gaps[:8]))}]"
            missing.append(where)
        if missing:
            raise CheckpointError(
                f"checkpoint lacks {len(missing)} tensor(s): {', '.join(missing[:8])}"
            )
        return self.loaded

    def _slot(self, name: str, path: Path) -> nnx.Variable:
        if path not in self.expected:
            raise CheckpointError(
                f"unexpected tensor {name!r}: this config has no {'.'.join(map(str, path))}"
            )
        if path in self.loaded:
            raise CheckpointError(f"tensor {name!r} is set twice")
        return self.expected[path]

    def _grouped(self, name, weight: GroupedWeight, module: Path) -> None:
        """Place a GroupedWeight's arrays (quant_group.GroupedWeight.device_arrays) as the
        grouped Dense at `module`."""
        for part, host in weight.device_arrays().items():
            path = module + (part,)
            if path not in self.expected:
                raise CheckpointError(
                    f"tensor {name!r} is quantized, but {'.'.join(map(str, module))} is not a "
                    f"grouped layer with {part}"
                )
            var = self._slot(name, path)
            if host.shape != tuple(var.shape):
                raise CheckpointError(
                    f"tensor {name!r}: its {part} is {host.shape}, not {var.shape}"
                )
            self.loaded[path] = _place(var, host, self.mesh)


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


def _place(var: nnx.Variable, host: np.ndarray, mesh: Mesh) -> nnx.Variable:
    """The variable with `host` on the mesh, laid out by its logical axes."""
    return var.replace(jax.device_put(host, sharding_for(mesh, var.axes, host.shape)))
