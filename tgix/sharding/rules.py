"""Logical parameter axes -> mesh axes, and the checks that a model fits a mesh.

Parameters are tagged at creation with logical axes (tgix/models/layers.py); this table is the
only place that decides how each is laid out. Heads and the MLP width split over "model" so
every matmul is local and one all-reduce per block joins the partial sums.
"""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tgix.models.config import ModelConfig

# logical axis -> mesh axis (None = replicated)
LOGICAL_TO_MESH: dict[str, str | None] = {
    "vocab": None,
    "embed": None,
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "mlp": "model",
    "norm": None,
}


def spec_for(axes: tuple[str, ...]) -> PartitionSpec:
    """PartitionSpec of a parameter from its logical axes."""
    return PartitionSpec(*(LOGICAL_TO_MESH[a] for a in axes))


def sharding_for(mesh: Mesh, axes: tuple[str, ...]) -> NamedSharding:
    return NamedSharding(mesh, spec_for(axes))


def kv_pages_sharding(mesh: Mesh) -> NamedSharding:
    """KV pages [num_pages, page_size, K, H]: KV heads on "model"."""
    return NamedSharding(mesh, PartitionSpec(None, None, LOGICAL_TO_MESH["kv_heads"], None))


def check_fits(cfg: ModelConfig, mesh: Mesh) -> None:
    """Query heads, KV heads and MLP width must divide the model axis; say which counts work."""
    shards = mesh.shape["model"]
    sizes = {
        "query heads": cfg.num_heads,
        "KV heads": cfg.num_kv_heads,
        "MLP width": cfg.intermediate_size,
    }
    bad = {name: size for name, size in sizes.items() if size % shards}
    if bad:
        valid = [s for s in range(1, cfg.num_heads + 1) if all(v % s == 0 for v in sizes.values())]
        counts = ", ".join(f"{size} {name}" for name, size in sizes.items())
        raise ValueError(
            f"cannot shard {counts} over {shards} devices; valid shard counts: {valid}"
        )
