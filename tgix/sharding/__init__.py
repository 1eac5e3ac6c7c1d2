"""Meshes and partitioning rules."""

from tgix.sharding.mesh import make_mesh, mesh_for_model, replica_meshes
from tgix.sharding.rules import (
    ShardingError,
    check_fits,
    kv_pages_sharding,
    kv_repeats,
    sharding_for,
    spec_for,
    valid_shard_counts,
)

__all__ = [
    "ShardingError",
    "check_fits",
    "kv_pages_sharding",
    "kv_repeats",
    "make_mesh",
    "mesh_for_model",
    "replica_meshes",
    "sharding_for",
    "spec_for",
    "valid_shard_counts",
]
