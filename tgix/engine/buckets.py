"""Static step shapes (host only): which padded shapes get compiled, and which one a step uses.

XLA compiles one executable per shape, so every step is padded up to a bucket chosen from a
fixed, finite set that the runner compiles ahead of time. Three shape families:

  fresh  every row starts at position 0 (a plain prefill): T tokens, R rows, no page reads
  paged  rows read KV from pages (decode; prompt chunks and prompts past a cached prefix):
         T tokens, R rows, P pages per row
  verify decode rows that carry drafts (--speculate k): R rows of up to k+1 tokens each,
         T = R * (k + 1), every token's logits sampled (the sampler runs T rows)
  sample the sampler per R rows and L history ids (L = 1 when no row uses penalties)

A vision-language model also compiles every fresh and mixed shape a second time with
`images`: the step then takes image embeddings [T, D] that replace the embeddings of the
tokens they mark (a prompt row's image tokens), so text-only steps pay nothing for them.

Fresh T buckets step by 2x and 1.5x alternately from 32 (48, 64, 96, 128, ...): a prompt step
pads by under 1.5x, where the GEMMs' cost follows T (80-token prompts ran in a 128-token
step, 100 ms, before; 96 now, 82 ms). Chunked steps' mixed T buckets do the same up to the
budget; without chunking (mixed steps up to max_total_tokens) they are powers of two, as
decode R buckets are. A mixed T of at most SMALL_MIXED_MAX_T also has an R = SMALL_MIXED_ROWS
shape: a chat turn beside a few decode rows then pays the LM head and sampler for 8 rows, not
T / 2 (measured on the default model, 3 decode rows + 80 new tokens past 1,150 cached
positions: T=128 R=64 410 ms, T=128 R=8 381 ms, T=96 R=8 330 ms; 7 decode rows + 34 tokens:
T=64 R=32 288 ms, T=48 R=8 245 ms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

SMALL_MIXED_ROWS = 8  # R of the second, small-row shape of a mixed T
SMALL_MIXED_MAX_T = 256  # above this the LM head for T / 2 rows is a small share of the step


def _powers(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    """lo, lo*factor, ... up to the first value >= hi (so hi always fits)."""
    out = [lo]
    while out[-1] < hi:
        out.append(out[-1] * factor)
    return tuple(out)


def _half_octaves(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from lo with the 1.5x step between each pair from 32 up (48, 96, 192,
    ...), up to the first value >= hi: a prompt step pads by at most a third (a half with
    powers alone), for 1.7x the shapes."""
    out = []
    for p in _powers(lo, hi):
        if out and out[-1] >= 32 and out[-1] * 3 // 2 < p and out[-1] < hi:
            out.append(out[-1] * 3 // 2)
        if not out or out[-1] < hi:
            out.append(p)
    return tuple(out)


def bucket_for(value: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


def _smallest(tokens: Sequence[int], rows_of, num_tokens: int, num_rows: int, kind: str) -> int:
    """The smallest T of `tokens` that holds num_tokens tokens in rows_of(T) >= num_rows rows."""
    for t in tokens:
        if t >= num_tokens and rows_of(t) >= num_rows:
            return t
    raise ValueError(f"no {kind} bucket for {num_tokens} tokens in {num_rows} rows")


@dataclasses.dataclass(frozen=True, slots=True)
class StepShape:
    """One compiled model step: `fresh` (prefill-only) or paged, padded to these sizes.
    `all_logits`: also return every prompt token's logprob (decoder_input_details).
    `verify`: logits at every token (T of them, not R): decode rows verifying drafts.
    `images`: the step also takes image embeddings for some of its tokens."""

    fresh: bool
    num_tokens: int
    num_rows: int
    pages_per_row: int
    all_logits: bool = False
    verify: bool = False
    images: bool = False

    @property
    def num_samples(self) -> int:
        """Rows of the sampler: one per token for a verify step, else one per row."""
        return self.num_tokens if self.verify else self.num_rows

    def logits_indices(self, row_ends: np.ndarray) -> np.ndarray:
        """Which tokens' logits the step returns: the backend's pack gives each row's last
        token (`row_ends` [R]); a verify step takes every token, in packed order [T]."""
        return np.arange(self.num_tokens, dtype=np.int32) if self.verify else row_ends


@dataclasses.dataclass(frozen=True, slots=True)
class Buckets:
    """The shape sets for one engine configuration.

    A fresh step of T tokens is compiled for rows_for(T) = clip(T // 16, 1, max rows) rows:
    one shape per T keeps start-up short, and the extra logits rows cost little next to T
    tokens of prefill. Paged steps read pages through a loop bounded by the longest row, so
    one page-table width (the longest sequence) serves every length.
    """

    prefill_tokens: tuple[int, ...]  # T of fresh steps
    decode_rows: tuple[int, ...]  # R (= T) of decode steps
    max_rows: int
    pages_per_row: int  # P of paged steps
    mixed_tokens: tuple[int, ...]  # T of paged steps with prompt rows (empty: fresh only)
    history: tuple[int, ...]  # L of the sampler (1 = no penalties in the step)
    prompt_logprobs: bool
    speculate: int = 0  # draft tokens per row (0: no verify shapes)
    verify_rows: tuple[int, ...] = ()  # R of verify steps (decode rows up to SPECULATE_ROWS)
    images: bool = False  # a vision-language model: fresh and mixed shapes with images too

    @classmethod
    def build(
        cls,
        *,
        max_batch_prefill_tokens: int,
        max_batch_size: int,
        max_total_tokens: int,
        page_size: int,
        chunked_prefill: bool = False,
        prefix_caching: bool = False,
        prompt_logprobs: bool = False,
        speculate: int = 0,
        speculate_rows: int = 0,
        images: bool = False,
    ) -> Buckets:
        # Without chunking a recomputed (preempted) request is prefilled whole, up to
        # max_total_tokens; with it, every prompt is cut to the budget but one whose prompt
        # logprobs need it whole. A prefill of max_batch_size short prompts needs a T with
        # rows_for(T) rows.
        whole = max_total_tokens if not chunked_prefill or prompt_logprobs else 0
        longest = max(max_batch_prefill_tokens, whole, 16 * max_batch_size)
        prefill_tokens = _half_octaves(16, longest)
        # Paged steps with prompt rows: chunks (their steps hold at most the prefill budget)
        # or, without chunking, prompts past a cached prefix (a prefill step of any length).
        mixed = ()
        if chunked_prefill:
            mixed = _half_octaves(16, max_batch_prefill_tokens)
        elif prefix_caching:
            mixed = _powers(16, longest)
        return cls(
            prefill_tokens=prefill_tokens,
            decode_rows=_powers(1, max_batch_size),
            max_rows=max_batch_size,
            pages_per_row=-(-max_total_tokens // page_size),
            mixed_tokens=mixed,
            history=(1, max_total_tokens),
            prompt_logprobs=prompt_logprobs,
            speculate=speculate,
            verify_rows=_powers(1, speculate_rows) if speculate and speculate_rows else (),
            images=images,
        )

    def rows_for(self, num_tokens: int) -> int:
        return max(1, min(num_tokens // 16, self.max_rows))

    def model_shapes(self) -> list[StepShape]:
        """Every model-step shape serving can ask for."""
        shapes = []
        for t in self.prefill_tokens:
            shapes.append(StepShape(True, t, self.rows_for(t), 0))
            if self.prompt_logprobs:
                shapes.append(StepShape(True, t, self.rows_for(t), 0, all_logits=True))
        shapes += [StepShape(False, r, r, self.pages_per_row) for r in self.decode_rows]
        p = self.pages_per_row
        for t in self.mixed_tokens:
            for r in self.mixed_row_options(t):
                shapes.append(StepShape(False, t, r, p))
                if self.prompt_logprobs:
                    shapes.append(StepShape(False, t, r, p, all_logits=True))
        shapes += [self.verify_shape(r) for r in self.verify_rows]
        if self.images:  # prompt shapes again, taking image embeddings
            prompt = [s for s in shapes if not s.verify and (s.fresh or s.num_tokens > s.num_rows)]
            shapes += [dataclasses.replace(s, images=True) for s in prompt]
        return shapes

    def verify_shape(self, num_rows: int) -> StepShape:
        r = bucket_for(num_rows, self.verify_rows)
        return StepShape(False, r * (self.speculate + 1), r, self.pages_per_row, verify=True)

    def mixed_rows(self, num_tokens: int) -> int:
        """R of the mixed step of T tokens: the largest power of two up to T / 2 (at most
        max_rows; the largest T gets max_rows, so every step fits). A mixed step has a row of
        2+ tokens, so it needs fewer rows than tokens, and T > R is what tells it apart from a
        decode step (T = R): with R = max_rows, a 64-token step past a cached prefix was the
        64-row decode shape and gathered its row's history once per token (5x slower past
        1,000 cached tokens)."""
        if num_tokens == self.mixed_tokens[-1]:
            return self.max_rows
        half = 1 << ((num_tokens // 2).bit_length() - 1)  # a power of two: a decode R's sampler
        return min(self.max_rows, half)

    def mixed_row_options(self, num_tokens: int) -> tuple[int, ...]:
        """The R of the mixed shapes of T tokens, ascending: SMALL_MIXED_ROWS too where it is
        fewer than mixed_rows(T) and T is at most SMALL_MIXED_MAX_T."""
        rows = self.mixed_rows(num_tokens)
        if num_tokens <= SMALL_MIXED_MAX_T and rows > SMALL_MIXED_ROWS:
            return (SMALL_MIXED_ROWS, rows)
        return (rows,)

    def sampler_shapes(self) -> list[tuple[int, int]]:
        """(R, L) pairs of the sampler."""
        rows = {s.num_samples for s in self.model_shapes()}
        return [(r, length) for r in sorted(rows) for length in self.history]

    def shape_for(
        self,
        rows: Sequence,
        *,
        all_logits: bool = False,
        verify: bool = False,
        images: bool = False,
    ) -> StepShape:
        """The smallest compiled shape holding these rows (objects with token_ids, start_pos).
        `verify`: decode rows with drafts (each at most speculate + 1 tokens). `images`: some
        row's tokens take image embeddings (a prompt shape with images, never a decode one)."""
        if verify:
            return self.verify_shape(len(rows))
        if images:
            if not self.images:
                raise ValueError("a step with image embeddings needs a vision model's shapes")
            return dataclasses.replace(self._text_shape(rows, all_logits, True), images=True)
        return self._text_shape(rows, all_logits, False)

    def _text_shape(self, rows: Sequence, all_logits: bool, prompt: bool) -> StepShape:
        """`prompt`: never the decode shape (a one-token prompt row past a cached prefix
        runs in a mixed shape then)."""
        num_tokens = sum(len(r.token_ids) for r in rows)
        logits = all_logits and self.prompt_logprobs
        if all(r.start_pos == 0 for r in rows):
            t = _smallest(self.prefill_tokens, self.rows_for, num_tokens, len(rows), "fresh")
            return StepShape(True, t, self.rows_for(t), 0, all_logits=logits)
        if num_tokens == len(rows) and not prompt:  # every row feeds one token: a decode step
            r = bucket_for(len(rows), self.decode_rows)
            return StepShape(False, r, r, self.pages_per_row)
        if not self.mixed_tokens:
            raise ValueError("a step with prompt rows past position 0 needs the mixed shapes")
        t = _smallest(self.mixed_tokens, self.mixed_rows, num_tokens, len(rows), "mixed")
        r = next(r for r in self.mixed_row_options(t) if r >= len(rows))
        return StepShape(False, t, r, self.pages_per_row, all_logits=logits)
