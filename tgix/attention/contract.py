"""The paged-attention contract every backend shares: step metadata, one layer's KV pages,
the page layout and the K/V write.

KV page layout (PagedLayout): per layer, k and v of shape [num_pages, page_size, K, H]. Page 0
is the null page: padding tokens write there and padded page-table entries point there, and it
is never read unmasked. A step packs the new tokens of several requests (rows) on one token
axis T; the metadata says, per token, where its K/V go and which row it belongs to, and per
row, which pages hold its history. A backend with another layout (a ragged kernel's) gives its
own kv_shape, pack and write; LayerKV then holds arrays of its kv_shape.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tgix.attention.pack import pack_step

# Finite, so a padding token whose row is empty gets a uniform (discarded) average, not NaN.
MASKED = -1e30


def soft_cap(scores: jax.Array, cap: float | None) -> jax.Array:
    """Gemma 2's attention soft-capping: cap * tanh(scores / cap) (scores already scaled);
    None leaves them as they are. Applied before the mask, as transformers does."""
    return scores if cap is None else cap * jnp.tanh(scores / cap)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Per-step device arrays; built on the host by the backend's `pack`.

    positions     [T] int32  absolute position of each token in its request
    slot_mapping  [T] int32  page * page_size + offset where the token's K/V are written (0: pad)
    token_rows    [T] int32  row (request) of each token
    cu_q_lens     [R+1] int32 start of each row's tokens on the T axis (for kernel backends)
    kv_lens       [R] int32  KV length of each row after this step (0 for padding rows)
    page_table    [R, P] int32 pages of each row in position order, padded with 0
    shared_pages  [R] int32  leading pages of each row's table that the step's leading decode
                             rows share (pack.shared_prefix_pages); the decode path reads them
                             once for all of them. Every nonzero entry is the same count.
                             None (jitted generate): nothing shared
    """

    positions: jax.Array
    slot_mapping: jax.Array
    token_rows: jax.Array
    cu_q_lens: jax.Array
    kv_lens: jax.Array
    page_table: jax.Array
    shared_pages: jax.Array | None = None


METADATA_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionMetadata))


def write_kv(pages: jax.Array, new: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """Scatter new K or V [T, K, H] into pages [num_pages, page_size, K, H] at slot_mapping.
    fp8 pages (byte storage, see FP8_STORAGE) get the values clipped to the format's range
    and cast (a plain cast to float8_e4m3fn does not saturate: 500.0 becomes NaN, which would
    poison every later read of the row), then their bytes scattered."""
    page_size = pages.shape[1]
    page, offset = slot_mapping // page_size, slot_mapping % page_size
    new = store_kv(new, pages.dtype)
    if new.shape[0] == 1:
        return jax.lax.dynamic_update_slice(pages, new[None], (page[0], offset[0], 0, 0))
    return pages.at[page, offset].set(new, mode="promise_in_bounds")


# fp8 KV pages are stored as bytes: XLA:CPU converts a whole fp8 array to float32 and back
# around an update of it that is also read in the step (a 30-layer step over a 32768-token
# cache took 81 ms instead of 1 ms in a probe; the default model decoded at 0.16x float32),
# while byte arrays update in place. The storage dtype names the format; readers gather
# bytes and convert only what they read (read_pages).
FP8_STORAGE = {
    jnp.dtype(jnp.float8_e4m3fn): jnp.dtype(jnp.uint8),
    jnp.dtype(jnp.float8_e5m2): jnp.dtype(jnp.int8),
}
_FORMAT = {storage: fp8 for fp8, storage in FP8_STORAGE.items()}


def storage_dtype(kv_dtype) -> jnp.dtype:
    """The dtype KV pages of `kv_dtype` are allocated in (fp8: its byte storage)."""
    return FP8_STORAGE.get(jnp.dtype(kv_dtype), jnp.dtype(kv_dtype))


def is_fp8(dtype) -> bool:
    """Whether pages of this (storage) dtype hold fp8 values."""
    return jnp.dtype(dtype) in _FORMAT


def read_pages(pages: jax.Array, index) -> jax.Array:
    """pages[index] as float32 (fp8 bytes reinterpreted after the gather)."""
    out = pages[index]
    if is_fp8(pages.dtype):
        out = jax.lax.bitcast_convert_type(out, _FORMAT[jnp.dtype(pages.dtype)])
    return out.astype(jnp.float32)


def store_kv(x: jax.Array, dtype) -> jax.Array:
    """x as pages of (storage) `dtype` hold it: fp8 values clipped to their finite range,
    cast, and reinterpreted as their bytes."""
    if not is_fp8(dtype):
        return x.astype(dtype)
    fp8 = _FORMAT[jnp.dtype(dtype)]
    top = float(jnp.finfo(fp8).max)
    clipped = jnp.clip(x.astype(jnp.float32), -top, top).astype(fp8)
    return jax.lax.bitcast_convert_type(clipped, dtype)


class LayerKV(NamedTuple):
    """One layer's KV pages: k and v, each of the backend's kv_shape ([num_pages, page_size,
    K, H] in the page layout)."""

    k: jax.Array
    v: jax.Array


class PagedLayout:
    """The page layout above, for the backends that keep it: kv_shape, the host `pack`
    (pack_step's arrays) and the K/V write."""

    pack = staticmethod(pack_step)

    @staticmethod
    def kv_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int):
        """[num_pages, page_size, K, H] for one layer's k (and v)."""
        return (num_pages, page_size, num_kv_heads, head_dim)

    @staticmethod
    def write(kv: LayerKV, k: jax.Array, v: jax.Array, md: AttentionMetadata) -> LayerKV:
        """kv with this step's k, v [T, K, H] written at md.slot_mapping."""
        return LayerKV(write_kv(kv.k, k, md.slot_mapping), write_kv(kv.v, v, md.slot_mapping))
