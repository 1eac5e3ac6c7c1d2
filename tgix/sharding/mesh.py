"""Device mesh construction: axes ("data", "model") over the visible (or given) devices.

The model axis carries tensor parallelism (heads, MLP width, vocabulary, KV heads); the data
axis carries independent replicas of the weights that split the batch. With several
processes (`jax.distributed`), `jax.devices()` lists every process's devices in process
order, so one mesh spans the group and every process builds the same one.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.sharding import Mesh

from tgix.models.config import ModelConfig
from tgix.sharding.rules import ShardingError, check_fits, check_width, valid_shard_counts

AXES = ("data", "model")

logger = logging.getLogger(__name__)


def make_mesh(model: int = 1, data: int = 1, devices=None) -> Mesh:
    """A (data, model) mesh over the first data * model devices."""
    devices = list(jax.devices() if devices is None else devices)
    needed = data * model
    if needed > len(devices) or needed < 1:
        raise ShardingError(
            f"a mesh of data={data} x model={model} needs {needed} devices; "
            f"{len(devices)} are visible"
        )
    return Mesh(np.array(devices[:needed]).reshape(data, model), AXES)


def mesh_for_model(
    cfg: ModelConfig,
    num_shard: int | None,
    *,
    data: int = 1,
    devices=None,
) -> Mesh:
    """The serving mesh for `cfg`: `num_shard` devices on "model" (an explicit count is
    checked and refused with the valid counts), or, when None (TGI's default of every
    visible device), the widest layout the heads allow on the devices left by `data`."""
    devices = list(jax.devices() if devices is None else devices)
    if data < 1:
        raise ShardingError(f"data-parallel degree must be >= 1, got {data}")
    if num_shard is None:
        available = len(devices) // data
        if available < 1:
            raise ShardingError(f"data={data} needs {data} devices; {len(devices)} are visible")
        num_shard = valid_shard_counts(cfg, available)[-1]
        if num_shard < available:
            logger.info(
                "%d devices per replica visible; %d query / %d KV heads shard over %d",
                available,
                cfg.num_heads,
                cfg.num_kv_heads,
                num_shard,
            )
    check_width(cfg, num_shard)  # the heads' verdict first: it names the counts that work
    mesh = make_mesh(model=num_shard, data=data, devices=devices)
    check_fits(cfg, mesh)
    return mesh


def replica_meshes(width: int, data: int, devices=None) -> list[Mesh]:
    """`data` (1, width) meshes over consecutive slices of the devices: the replicas of
    --data-parallel, replica r on devices [r * width, (r + 1) * width)."""
    devices = list(jax.devices() if devices is None else devices)
    if data * width > len(devices):
        raise ShardingError(
            f"{data} replicas of {width} devices need {data * width}; {len(devices)} are visible"
        )
    slices = (devices[r * width : (r + 1) * width] for r in range(data))
    return [make_mesh(model=width, devices=d) for d in slices]
