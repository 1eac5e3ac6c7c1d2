"""The attention backend protocol, today's two backends, and the registry.

A backend owns its KV layout (kv_shape), packs its own metadata from a step's rows on the host
(pack), and is called once per layer with the step's q, k, v (rope applied): it writes k and v
into its pages itself and picks its own path from `fresh` (static) and the shapes. Kernel
backends (Pallas for GPU/TPU, a ragged kernel with its own layout) register in BACKENDS and are
tested against "reference".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import jax
import numpy as np

from tgix.attention.contract import AttentionMetadata, LayerKV, PagedLayout
from tgix.attention.reference import own_token_pages, reference_attention
from tgix.attention.xla import paged_attention, prefill_attention
from tgix.attention.xla_mixed import mixed_attention


@runtime_checkable
class AttentionBackend(Protocol):
    """What the model and the runner call; see the module docstring."""

    name: str

    def kv_shape(
        self, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """Shape of one layer's k (and v) array."""
        ...

    def pack(
        self,
        rows: Sequence,
        *,
        page_size: int,
        num_tokens: int,
        num_rows: int,
        pages_per_row: int,
    ) -> dict[str, np.ndarray]:
        """Host (numpy) arrays of one step padded to its bucket (num_tokens T, num_rows R):
        AttentionMetadata's fields, token_ids [T] and logits_indices [R]. `rows`: objects with
        token_ids, start_pos and pages (tgix.attention.pack.RowInput's fields)."""
        ...

    def __call__(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        kv: LayerKV,
        md: AttentionMetadata,
        *,
        fresh: bool,
        sliding_window: int | None,
        softcap: float | None = None,
    ) -> tuple[jax.Array, LayerKV]:
        """q [T, N, H], this step's k, v [T, K, H] -> (out [T, N, H], kv holding k and v).
        `fresh` (static): no row has KV from earlier steps (every row starts at 0).
        `softcap` (static): scores = cap * tanh(scores / cap) before the mask (Gemma 2)."""
        ...


@dataclasses.dataclass(frozen=True)
class XlaBackend(PagedLayout):
    """The "paged" backend, the default: today's XLA paths, picked from `fresh` and the shapes.
    Fresh rows: prefill_attention (block-sparse over the step's own K/V, no page read); one
    token per row (T == R): paged_attention; otherwise (prompt chunks beside decode rows or
    continuing a prompt): mixed_attention."""

    name: ClassVar[str] = "paged"

    def __call__(self, q, k, v, kv, md, *, fresh, sliding_window, softcap=None):
        kv = self.write(kv, k, v, md)
        mask = dict(sliding_window=sliding_window, softcap=softcap)
        if fresh:
            out = prefill_attention(q, k, v, md, **mask)
        elif q.shape[0] > md.kv_lens.shape[0]:  # prompt chunks in the step
            out = mixed_attention(q, k, v, kv.k, kv.v, md, **mask)
        else:
            out = paged_attention(q, kv.k, kv.v, md, **mask)
        return out, kv


@dataclasses.dataclass(frozen=True)
class ReferenceBackend(PagedLayout):
    """The "reference" backend, the oracle: reference_attention over the pages after the write,
    in every step; a fresh step packed without a page table (pages_per_row 0) reads its own K/V
    as one-token pages instead."""

    name: ClassVar[str] = "reference"

    def __call__(self, q, k, v, kv, md, *, fresh, sliding_window, softcap=None):
        kv = self.write(kv, k, v, md)
        k_pages, v_pages = kv
        if fresh and md.page_table.shape[1] == 0:
            k_pages, v_pages, md = own_token_pages(k, v, md)
        out = reference_attention(
            q, k_pages, v_pages, md, sliding_window=sliding_window, softcap=softcap
        )
        return out, kv


BACKENDS: dict[str, type] = {"paged": XlaBackend, "reference": ReferenceBackend}
DEFAULT_BACKEND = "paged"


def backend(name: str = DEFAULT_BACKEND) -> AttentionBackend:
    """The registered backend called `name`; ValueError naming the known ones otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name]()
