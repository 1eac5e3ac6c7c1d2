"""Meshes and partitioning rules."""

from tgix.sharding.mesh import make_mesh
from tgix.sharding.rules import check_fits, kv_pages_sharding, sharding_for, spec_for

__all__ = ["check_fits", "kv_pages_sharding", "make_mesh", "sharding_for", "spec_for"]
