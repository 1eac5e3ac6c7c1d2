"""Logical parameter axes -> mesh axes, and the checks that a model fits a mesh.

Parameters are tagged at creation with logical axes (tgix/models/layers.py); this table is the
only place that decides how each is laid out. Heads and the MLP width split over "model" so
every matmul is local and one all-reduce per block joins the partial sums. The vocabulary
(embedding table, LM head) splits over "model" too when V divides evenly: the head is the
largest single matrix of a small model (28M of SmolLM2-135M's 135M parameters), and the
[R, V] logits it produces are gathered once per step, which costs far less than every device
reading the whole head.

KV heads: when the model axis is wider than K but a multiple of it, each KV head is repeated
(shards / K) times at load time (`kv_repeats`), so every device holds the one KV head its
query heads read, as TGI and vLLM do.
"""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tgix.models.config import ModelConfig

# logical axis -> mesh axis (None = replicated)
LOGICAL_TO_MESH: dict[str, str | None] = {
    "vocab": "model",
    "embed": None,
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "mlp": "model",
    "norm": None,
    "draft_heads": None,  # Medusa heads and their blocks (tgix/models/medusa.py)
    "act_order": None,  # a grouped layer's input permutation (tgix/models/quant_group.py)
    "packed": None,  # cpu_int8.pack's codes (one-device meshes only: an FFI call)
    "router": None,  # MoE router [E, D] (tgix/models/moe.py): every device routes every token
    "experts": "model",  # stacked experts: an expert axis when E divides the model axis...
    "expert_mlp": "model",  # ...else each expert tensor-parallel (a mesh axis is used once)
}


class ShardingError(ValueError):
    """A model that cannot be laid out on the requested mesh (a start-up error)."""


def spec_for(axes: tuple[str, ...], shape: tuple[int, ...] | None = None, shards: int = 1):
    """PartitionSpec of a parameter from its logical axes. With `shape`, an axis whose size
    does not divide `shards` stays replicated (only the vocabulary can be uneven: the head
    and MLP checks in `check_fits` refuse the others)."""
    parts = []
    for i, axis in enumerate(axes):
        mesh_axis = LOGICAL_TO_MESH[axis]
        if mesh_axis is not None and shape is not None and shape[i] % shards:
            mesh_axis = None
        parts.append(None if mesh_axis in parts else mesh_axis)  # first logical axis wins
    return PartitionSpec(*parts)


def expert_axis(cfg: ModelConfig, shards: int) -> bool:
    """Whether stacked experts split over the model axis by expert (E divides it), not inside
    each expert (tgix/models/moe.py computes them densely then: each device its own)."""
    return cfg.is_moe and shards > 1 and cfg.num_experts % shards == 0


def sharding_for(mesh: Mesh, axes: tuple[str, ...], shape=None) -> NamedSharding:
    return NamedSharding(mesh, spec_for(axes, shape, mesh.shape["model"]))


def kv_pages_sharding(mesh: Mesh) -> NamedSharding:
    """KV pages [num_pages, page_size, K, H]: KV heads on "model"."""
    return NamedSharding(mesh, PartitionSpec(None, None, LOGICAL_TO_MESH["kv_heads"], None))


def kv_repeats(num_kv_heads: int, shards: int) -> int:
    """How many copies of each KV head a `shards`-wide model axis needs: 1 when K divides
    evenly, shards / K when the axis is a multiple of K, 0 when neither (no layout)."""
    if num_kv_heads % shards == 0:
        return 1
    if shards % num_kv_heads == 0:
        return shards // num_kv_heads
    return 0


def fits(cfg: ModelConfig, shards: int) -> bool:
    dense_mlp = not cfg.is_moe or not all(cfg.moe_layers)
    experts = not cfg.is_moe or expert_axis(cfg, shards) or cfg.expert_size % shards == 0
    shared = cfg.shared_expert_size % shards == 0
    return (
        cfg.num_heads % shards == 0
        and (not dense_mlp or cfg.intermediate_size % shards == 0)
        and experts
        and shared
        and kv_repeats(cfg.num_kv_heads, shards) > 0
    )


def valid_shard_counts(cfg: ModelConfig, limit: int | None = None) -> list[int]:
    """Every model-axis width this model can be split over (up to `limit` devices)."""
    top = cfg.num_heads if limit is None else min(limit, cfg.num_heads)
    return [s for s in range(1, top + 1) if fits(cfg, s)]


def check_fits(cfg: ModelConfig, mesh: Mesh) -> None:
    """Query heads and MLP width must divide the model axis, KV heads divide it or be a
    divisor of it (then replicated); the error names the counts and the widths that work."""
    check_width(cfg, mesh.shape["model"])


def check_width(cfg: ModelConfig, shards: int) -> None:
    """check_fits for a model-axis width, before any mesh exists."""
    if fits(cfg, shards):
        return
    counts = (
        f"{cfg.num_heads} query heads, {cfg.num_kv_heads} KV heads and MLP width "
        f"{cfg.intermediate_size}"
    )
    if cfg.is_moe:
        counts += f" ({cfg.num_experts} experts of width {cfg.expert_size})"
    raise ShardingError(
        f"cannot shard {counts} over {shards} devices; valid shard counts: "
        f"{', '.join(map(str, valid_shard_counts(cfg)))}"
    )
