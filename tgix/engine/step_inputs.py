"""A step's inputs on the host (numpy): each row's sampling and grammar mask, packed into the
HostStep that `Runner.dispatch` sends.

`row_inputs` reads them off the rows' RequestStates (the engine thread's side);
`pack_host_step` pads everything to the step's bucket: the attention backend's `pack` for
token ids and metadata, sampling_host for the sampler's arrays and histories, the grammar
words (all allowed for rows without one), and a vision prompt's image embeddings at its
image tokens (`row_images`). Kept apart from the Runner, which owns the
device state, so what a dispatch sends (and what process 0 broadcasts) is built in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tgix.attention.contract import METADATA_FIELDS
from tgix.engine.batch import HostStep
from tgix.engine.buckets import StepShape
from tgix.engine.request import SamplingParams
from tgix.engine.sampling_host import pack_history, pack_sampling
from tgix.engine.token_mask import ALL_ALLOWED

if TYPE_CHECKING:
    from tgix.attention.backend import AttentionBackend
    from tgix.engine.request_state import RequestState


@dataclasses.dataclass(frozen=True)
class RowSampling:
    """What the sampler needs of one row: its settings, the position of the token it is
    producing (seeded draws fold it in), and its token history: prompt + generated ids when
    it uses penalties, at least the previous token with a watermark, else empty."""

    params: SamplingParams
    position: int
    history: Sequence[int]


def row_inputs(
    rows: Sequence, seqs: Sequence[RequestState | None], *, verify: bool = False
) -> tuple[list[RowSampling], list[np.ndarray | None]]:
    """Per row (PlanRow-like) its RowSampling and its grammar's packed allowed-token words
    (None: unconstrained, or a row that produces no token). A row whose request ended
    meanwhile (None) samples greedily; its result is discarded. `verify`: one entry per
    token instead (verify_inputs)."""
    if verify:
        return verify_inputs(rows, seqs)
    sampling = [
        RowSampling(seq.params, r.end_pos, seq.history())
        if seq is not None
        else RowSampling(SamplingParams(), r.start_pos + 1, [])  # ended meanwhile
        for r, seq in zip(rows, seqs, strict=True)
    ]
    masks = [
        seq.token_mask() if seq is not None and r.produces_token else None
        for r, seq in zip(rows, seqs, strict=True)
    ]
    return sampling, masks


def verify_inputs(
    rows: Sequence, seqs: Sequence[RequestState | None]
) -> tuple[list[RowSampling], list[np.ndarray | None]]:
    """A verify step samples at every token: a row [last, d1..dk] has k+1 entries, entry j
    producing position start + j + 1 after the drafts d1..dj. Each entry sees exactly what
    decoding without drafts would have at that point: its seeded draw keyed by that
    position, penalties over the history with d1..dj appended, the watermark's previous
    token dj, and the grammar mask of the state after d1..dj (seq.draft.states[j]). A row
    without drafts (num_logits 1: one token, or a grammar's forced ones) samples at its last
    token as in a decode step; its other entries are greedy fillers, never read."""
    sampling, masks = [], []
    for row, seq in zip(rows, seqs, strict=True):
        n = len(row.token_ids)
        if seq is None or row.num_logits == 1:
            sampling += [RowSampling(SamplingParams(), row.start_pos + j + 1, []) for j in range(n)]
            masks += [None] * n
            if seq is not None:
                sampling[-1] = RowSampling(seq.params, row.end_pos, seq.history())
                masks[-1] = seq.token_mask()
            continue
        history = seq.history()
        grammar = seq.request.grammar if seq.request is not None else None
        states = seq.draft.states
        for j in range(n):
            drafts = row.token_ids[1 : j + 1]
            if seq.params.uses_penalties:
                seen = [*history, *drafts]
            elif seq.params.watermark:
                seen = list(drafts[-1:]) or history
            else:
                seen = []
            sampling.append(RowSampling(seq.params, row.start_pos + j + 1, seen))
            if grammar is None or seq.grammar_failure is not None:
                masks.append(None)
            elif j == 0:
                masks.append(seq.token_mask())
            else:
                masks.append(grammar.mask(states[j]))
    return sampling, masks


def request_images(seqs: Sequence[RequestState | None]) -> list | None:
    """Per row its request's ImageSpans or None; None when no row's request has images."""
    spans = [None if s is None or s.request is None else s.request.images for s in seqs]
    return spans if any(s is not None for s in spans) else None


def prompt_images(rows: Sequence, images: Sequence | None) -> list | None:
    """Per row (PlanRow-like) the ImageSpans of a prompt row whose tokens include image
    tokens, else None; None when no row has any (a text-only step)."""
    if images is None:
        return None
    spans = []
    for row, spans_of in zip(rows, images, strict=True):
        keep = spans_of is not None and getattr(row, "is_prompt", True)
        if keep:
            lo, hi = spans_of.span(row.start_pos, row.end_pos)
            keep = hi > lo
        spans.append(spans_of if keep else None)
    return spans if any(s is not None for s in spans) else None


def _pack_images(rows: Sequence, images: Sequence, cu_q_lens: np.ndarray, num_tokens: int):
    """The step's image embeddings [T, D] float32 (zero where a token has none) and which
    tokens take them [T] bool: row i's token at position p sits at cu_q_lens[i] + p -
    start_pos on the token axis."""
    width = next(s.embeds.shape[1] for s in images if s is not None)
    embeds = np.zeros((num_tokens, width), np.float32)
    marked = np.zeros(num_tokens, np.bool_)
    for i, (row, spans) in enumerate(zip(rows, images, strict=True)):
        if spans is None:
            continue
        lo, hi = spans.span(row.start_pos, row.end_pos)
        at = cu_q_lens[i] + spans.positions[lo:hi] - row.start_pos
        embeds[at] = spans.embeds[lo:hi]
        marked[at] = True
    return embeds, marked


def _rope_positions(rows: Sequence, spans: Sequence, packed: dict) -> np.ndarray:
    """An M-RoPE model's positions [3, T] int32: a prompt token of a request with images has
    its three rows from ImageSpans.rope_positions; every later token sits at its position +
    the request's rope delta on all three (text-only requests: delta 0, the plain rope)."""
    positions = np.broadcast_to(packed["positions"], (3, len(packed["positions"]))).copy()
    starts = packed["cu_q_lens"]
    for i, (row, images) in enumerate(zip(rows, spans, strict=True)):
        if images is None or images.rope_positions is None:
            continue
        at = slice(starts[i], starts[i] + len(row.token_ids))
        prompt_len = images.rope_positions.shape[1]
        own = np.arange(row.start_pos, row.end_pos)
        rows3 = own + images.rope_delta  # generated tokens (and a recompute's)
        rows3 = np.broadcast_to(rows3, (3, len(own))).copy()
        in_prompt = own < prompt_len
        rows3[:, in_prompt] = images.rope_positions[:, own[in_prompt]]
        positions[:, at] = rows3
    return positions.astype(np.int32)


def pack_host_step(
    backend: AttentionBackend,
    rows: Sequence,
    sampling: Sequence[RowSampling],
    shape: StepShape,
    *,
    page_size: int,
    history_lengths: Sequence[int],
    vocab_size: int,
    token_masks: Sequence[np.ndarray | None] | None = None,
    images: Sequence | None = None,
    rope_rows: Sequence | None = None,
) -> HostStep:
    """Rows (PlanRow-like: token_ids, start_pos, pages) and one RowSampling per row (per
    token for a verify shape) -> the HostStep of `shape`. `history_lengths`: the buckets'
    history lengths (the shortest unless a row uses penalties or a watermark);
    `token_masks`: per row (per token) packed words [W] uint32 or None; `images`: per row
    ImageSpans or None (row_images; a shape with `images`); `rope_rows`: an M-RoPE model's
    rows' ImageSpans (their requests' images, any row kind) or None, for rope_positions."""
    packed = backend.pack(
        rows,
        page_size=page_size,
        num_tokens=shape.num_tokens,
        num_rows=shape.num_rows,
        pages_per_row=shape.pages_per_row,
    )
    history_len = _history_len(sampling, history_lengths)
    samples = shape.num_samples
    positions = np.zeros(samples, np.int32)
    positions[: len(sampling)] = [s.position for s in sampling]
    logits_indices = shape.logits_indices(packed["logits_indices"])
    extras = {}
    if shape.images:
        extras["image_embeds"], extras["image_marks"] = _pack_images(
            rows, images, packed["cu_q_lens"], shape.num_tokens
        )
    if rope_rows is not None:
        extras["rope_positions"] = _rope_positions(rows, rope_rows, packed)
    return HostStep(
        shape=shape,
        history_len=history_len,
        token_ids=packed["token_ids"],
        metadata={k: packed[k] for k in METADATA_FIELDS},
        logits_indices=logits_indices,
        sampling=pack_sampling([s.params for s in sampling], samples),
        positions=positions,
        history=pack_history([s.history for s in sampling], samples, history_len),
        masks=_pack_masks(token_masks, samples, vocab_size),
        extras=extras,
    )


def _pack_masks(token_masks, num_rows: int, vocab_size: int) -> np.ndarray | None:
    if not token_masks or all(m is None for m in token_masks):
        return None
    words = -(-vocab_size // 32)
    packed = np.full((num_rows, words), ALL_ALLOWED, dtype=np.uint32)
    for i, mask in enumerate(token_masks):
        if mask is not None:
            packed[i] = mask
    return packed


def _history_len(sampling: Sequence[RowSampling], lengths: Sequence[int]) -> int:
    if not any(s.params.uses_penalties or s.params.watermark for s in sampling):
        return lengths[0]
    return lengths[-1]
