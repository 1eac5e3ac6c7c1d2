"""Next-token choice on device; every request setting is a per-row array, so one executable
per (R, L) bucket serves any mix. R rows, V vocab (below `vocab_limit`), L history, N top-n,
K candidates. TGI's order: watermark -> repetition -> frequency/presence penalty -> token_mask
-> temperature -> top_k -> top_p -> typical_p -> argmax or seeded draw; greedy rows skip the
warpers. Batch-level `lax.cond`s skip stages no row uses (all-greedy: a logsumexp, a top-k).

Differences from TGI, on purpose:
- top_k/top_p/typical_p work inside the K = CANDIDATES best tokens (`lax.top_k`; a full sort
  per row is far too slow on CPU): with one of them on, tokens outside are never drawn and
  top_k > K acts as K. Temperature-only rows draw from the full vocab (exact).
- Frequency penalty is OpenAI's `logit -= freq * count` (TGI divides the count by the padded
  length); presence is `logit -= presence * (count > 0)`.
- The watermark green list hashes (previous token, id) instead of TGI's torch.randperm (not
  reproducible in JAX): TGI's detector will not see it; use `watermark_green_mask`.
- Each row draws with fold_in(threefry key of its uint64 seed, position): the same tokens
  whatever its row, batch mates or process (not torch's generator stream).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

CANDIDATES = 256  # K: see benchmarks/sampling.py; 1024 costs ~3x more at R=32 on CPU
_BLOCK = 32  # ids per block for the two-level draw and the small exact top-k
_SMALL_TOP_K = 32  # up to this k, `_top_k` selects blocks first (much faster on CPU)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingArrays:
    """Per-row settings [R], neutral values switch a stage off: do_sample (bool, already TGI's
    effective rule, SamplingParams.is_sampling), top_k (int32, 0 = off), watermark (bool), seed
    (uint32 [R, 2]: the uint64 seed as threefry key data (hi, lo)), the rest float32."""

    do_sample: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    typical_p: jax.Array
    repetition_penalty: jax.Array
    frequency_penalty: jax.Array
    presence_penalty: jax.Array
    watermark: jax.Array
    seed: jax.Array

    @classmethod
    def from_host(cls, packed: Mapping[str, Any]) -> SamplingArrays:
        """From `sampling_host.pack_sampling`'s dict of numpy arrays."""
        return cls(**{f.name: jnp.asarray(packed[f.name]) for f in dataclasses.fields(cls)})


class SampleOutput(NamedTuple):
    """token_ids [R] int32; logprobs [R] f32 (log-softmax of the processed logits at the
    token); top_ids [R, N] int32 and top_logprobs [R, N] f32, best first (-inf where a warper
    removed the token)."""

    token_ids: jax.Array
    logprobs: jax.Array
    top_ids: jax.Array
    top_logprobs: jax.Array


def sample(
    logits: jax.Array,
    arrays: SamplingArrays,
    positions: jax.Array,
    history: jax.Array,
    *,
    num_top: int,
    vocab_limit: int,
    watermark_gamma: float = 0.5,
    watermark_delta: float = 2.0,
    token_mask: jax.Array | None = None,
) -> SampleOutput:
    """Choose one token per row from logits [R, V_model].

    positions [R] int32: index in its sequence of the token being produced (keys the draw).
    history [R, L] int32: prompt + generated ids, -1 padded; its last real id is the previous
        token (watermark). L may be 1 when no row uses penalties.
    vocab_limit: ids >= it (model vocab padding) are never produced nor counted in logprobs.
    token_mask [R, V_model] bool: allowed tokens (grammar); None = all.
    """
    vocab = min(vocab_limit, logits.shape[1])
    x = logits[:, :vocab].astype(jnp.float32)
    uses_history = arrays.watermark | (arrays.repetition_penalty != 1.0)
    uses_history |= (arrays.frequency_penalty != 0.0) | (arrays.presence_penalty != 0.0)
    with_history = partial(_process_history, gamma=watermark_gamma, delta=watermark_delta)
    x = lax.cond(jnp.any(uses_history), with_history, lambda x, *_: x, x, arrays, history)
    if token_mask is not None:
        x = jnp.where(token_mask[:, :vocab], x, -jnp.inf)

    # Greedy rows need only these; they are computed the same way whatever the batch holds.
    lse = jax.nn.logsumexp(x, axis=-1)
    best, best_ids = _top_k(x, max(num_top, 1))
    greedy = best_ids[:, 0]  # the first of equal maxima, like argmax
    best, best_ids = best[:, :num_top], best_ids[:, :num_top]

    def greedy_only():
        return greedy, _at(x, greedy) - lse, best - lse[:, None], best_ids

    def general():  # greedy rows keep greedy_only's values exactly
        tok, logprob, top, top_ids = greedy_only()
        sampled = arrays.do_sample
        temperature = jnp.where(sampled, arrays.temperature, 1.0)[:, None]
        scaled = x / temperature
        scaled_lse = jax.nn.logsumexp(scaled, axis=-1)
        num_cand = min(max(CANDIDATES, num_top), vocab)
        num_noise = num_cand + -(-vocab // _BLOCK) + _BLOCK  # see _draw_full_vocab
        noise = jax.vmap(partial(_row_gumbels, size=num_noise))(arrays.seed, positions)
        cut = sampled & ((arrays.top_k > 0) | (arrays.top_p < 1.0) | (arrays.typical_p < 1.0))
        whole = sampled & ~cut  # temperature only: the full vocab
        drawn = lax.cond(
            jnp.any(whole), _draw_full_vocab, lambda *_: tok, scaled, noise[:, num_cand:]
        )
        tok = jnp.where(whole, drawn, tok)
        logprob = jnp.where(whole, _at(scaled, tok) - scaled_lse, logprob)
        top = jnp.where(whole[:, None], best / temperature - scaled_lse[:, None], top)
        cut_rows = lax.cond(
            jnp.any(cut),
            partial(_sample_candidates, num_top=num_top),
            lambda *_: greedy_only(),
            scaled, scaled_lse, arrays, noise[:, :num_cand],
        )  # fmt: skip
        return tuple(
            jnp.where(cut.reshape(-1, *[1] * (mine.ndim - 1)), mine, other)
            for mine, other in zip(cut_rows, (tok, logprob, top, top_ids), strict=True)
        )

    tok, logprob, top, top_ids = lax.cond(jnp.any(arrays.do_sample), general, greedy_only)
    return SampleOutput(tok.astype(jnp.int32), logprob, top_ids.astype(jnp.int32), top)


def _sample_candidates(scaled, lse, arrays: SamplingArrays, noise, *, num_top: int):
    """Rows with a truncating warper: warp and draw (Gumbel-max with noise [R, K]) inside the
    K best of scaled [R, V] (log-normaliser lse [R]). Returns token [R], logprob [R], top [R, N]
    and top ids [R, N]."""
    cand, cand_ids = lax.top_k(scaled, noise.shape[1])
    cand = _warp(cand, lse, scaled, arrays)
    pick = jnp.argmax(cand + noise, axis=-1)
    cand_lse = jax.nn.logsumexp(cand, axis=-1)
    top, top_at = (a[:, :num_top] for a in lax.top_k(cand, max(num_top, 1)))
    top_ids = jnp.take_along_axis(cand_ids, top_at, 1)
    return _at(cand_ids, pick), _at(cand, pick) - cand_lse, top - cand_lse[:, None], top_ids


def prompt_scores(
    logits: jax.Array, next_ids: jax.Array, num_top: int, vocab_limit: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Raw (unprocessed) log-softmax scores of logits [T, V] (TGI's prompt logprobs): the
    logprob at next_ids [T] f32, and the num_top best ids [T, N] int32 with their logprobs
    [T, N] f32 (OpenAI completions' `echo` + `logprobs`). vocab_limit drops model vocab
    padding from the normaliser, as `sample` does."""
    x = logits[:, :vocab_limit].astype(jnp.float32)
    lse = jax.nn.logsumexp(x, axis=-1)
    top, top_ids = _top_k(x, num_top)
    return _at(x, next_ids) - lse, top_ids.astype(jnp.int32), top - lse[:, None]


def watermark_green_mask(prev_tokens: jax.Array, vocab_size: int, gamma: float) -> jax.Array:
    """[R, V] bool green list per previous token [R]: a share `gamma` of ids, chosen by a
    bit-mixing hash of (previous token, id). Counter-based, so it needs no sort or RNG state
    and a detector can recompute it from the text alone."""
    threshold = jnp.uint32(min(max(int(gamma * 2**32), 0), 2**32 - 1))  # gamma 1: all but 2^-32
    row = _mix32(prev_tokens.astype(jnp.uint32) + jnp.uint32(0x9E3779B9))
    ids = lax.broadcasted_iota(jnp.uint32, (1, vocab_size), 1)
    return _mix32(row[:, None] ^ ids) < threshold


def _mix32(h: jax.Array) -> jax.Array:
    """uint32 avalanche (Wellons' lowbias32): every input bit flips each output bit ~50%."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x7FEB352D)
    h = (h ^ (h >> 15)) * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def _process_history(x, arrays: SamplingArrays, history, *, gamma, delta):
    """Watermark (only when some row has it), then penalties: TGI's order."""
    watermark = partial(_add_watermark, gamma=gamma, delta=delta)
    x = lax.cond(jnp.any(arrays.watermark), watermark, lambda x, *_: x, x, arrays, history)
    return _penalise(x, arrays, history)


def _add_watermark(x, arrays: SamplingArrays, history, *, gamma, delta):
    """Kirchenbauer: + delta on the green list of the row's previous token (last real id of
    history [R, L]); rows without watermark or without history are untouched."""
    where_real = jnp.where(history >= 0, lax.broadcasted_iota(jnp.int32, history.shape, 1), -1)
    last = jnp.max(where_real, axis=1)  # [R], -1 when the row has no history
    prev = _at(history, jnp.maximum(last, 0))
    green = watermark_green_mask(prev, x.shape[1], gamma)
    return x + jnp.where(green & (arrays.watermark & (last >= 0))[:, None], delta, 0.0)


def _penalise(x, arrays: SamplingArrays, history):
    """Penalties from the id counts of history [R, L] (pads -1 and ids >= V are dropped).
    Repetition is HF's (logit < 0 ? *p : /p on seen ids); neutral rows come out bit-identical."""
    rows, vocab = x.shape
    ids = jnp.where((history >= 0) & (history < vocab), history, vocab)
    row_of = lax.broadcasted_iota(jnp.int32, history.shape, 0)
    counts = jnp.zeros((rows, vocab), jnp.float32).at[row_of, ids].add(1.0, mode="drop")
    seen = counts > 0
    rep = arrays.repetition_penalty[:, None]
    x = jnp.where(seen, jnp.where(x < 0, x * rep, x / rep), x)
    x = x - arrays.frequency_penalty[:, None] * counts
    return x - arrays.presence_penalty[:, None] * seen


def _warp(cand, lse_full, scaled, arrays: SamplingArrays):
    """TGI's top_k -> top_p -> typical_p on candidates [R, K] (best first) of scaled [R, V]
    (log-normaliser lse_full [R]); removed ones become -inf. Until a warper has cut a row, its
    normaliser and entropy are the full vocab's (exact), then the kept candidates'."""
    rank = lax.broadcasted_iota(jnp.int32, cand.shape, 1)
    on = arrays.do_sample
    use_k = on & (arrays.top_k > 0)
    kth = _at(cand, jnp.clip(arrays.top_k - 1, 0, cand.shape[1] - 1))
    cand = jnp.where(use_k[:, None] & (cand < kth[:, None]), -jnp.inf, cand)  # ties kept (HF)

    use_p = on & (arrays.top_p < 1.0)
    norm = jnp.where(use_k, jax.nn.logsumexp(cand, axis=-1), lse_full)
    probs = jnp.exp(cand - norm[:, None])
    mass_before = jnp.cumsum(probs, axis=1) - probs  # HF: ascending cumsum <= 1 - top_p
    drop = use_p[:, None] & (mass_before >= arrays.top_p[:, None]) & (rank > 0)
    cand = jnp.where(drop, -jnp.inf, cand)
    truncated = use_k | use_p

    use_t = on & (arrays.typical_p < 1.0)
    cand = lax.cond(
        jnp.any(use_t), _typical, lambda c, *_: c, cand, truncated, use_t, lse_full, scaled,
        arrays.typical_p,
    )  # fmt: skip
    return cand


def _typical(cand, truncated, use_t, lse_full, scaled, mass):
    """HF's TypicalLogitsWarper on candidates [R, K]: keep the tokens whose surprisal is
    closest to the entropy until `mass` is covered. Exact when that set lies in the
    candidates; untruncated rows take the entropy of the full vocab [R, V]."""
    norm = jnp.where(truncated, jax.nn.logsumexp(cand, axis=-1), lse_full)
    logp = cand - norm[:, None]
    full_entropy = lambda: _entropy(scaled - lse_full[:, None])  # one pass over [R, V]
    ent = _entropy(logp)
    ent = lax.cond(
        jnp.any(use_t & ~truncated), lambda: jnp.where(truncated, ent, full_entropy()), lambda: ent
    )
    shifted = jnp.where(jnp.isfinite(logp), jnp.abs(logp + ent[:, None]), jnp.inf)
    # HF sorts by shifted and keeps up to where the running mass reaches `mass`, plus ties: the
    # tokens whose more-typical mass is below it (a pairwise [R, K, K] sum beats a CPU sort).
    more_typical = shifted[:, None, :] < shifted[:, :, None]
    mass_before = jnp.sum(jnp.where(more_typical, jnp.exp(logp)[:, None, :], 0.0), axis=-1)
    keep = mass_before < mass[:, None]
    return jnp.where(use_t[:, None] & ~keep, -jnp.inf, cand)


def _entropy(logp):
    """[R] entropy from log-probs [R, X] (-inf = removed)."""
    return -jnp.sum(jnp.where(jnp.isfinite(logp), jnp.exp(logp) * logp, 0.0), axis=-1)


def _draw_full_vocab(scaled, noise):
    """[R] exact draw from softmax(scaled [R, V]): a block of _BLOCK ids by its total mass,
    then an id inside it, both Gumbel-max with noise [R, V / _BLOCK + _BLOCK] (not R * V)."""
    rows, vocab = scaled.shape
    pad = -vocab % _BLOCK
    blocks = jnp.pad(scaled, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    blocks = blocks.reshape(rows, -1, _BLOCK)
    num_blocks = blocks.shape[1]
    block = jnp.argmax(jax.nn.logsumexp(blocks, axis=-1) + noise[:, :num_blocks], axis=-1)
    inner = jnp.take_along_axis(blocks, block[:, None, None], 1)[:, 0]  # [R, _BLOCK]
    return block * _BLOCK + jnp.argmax(inner + noise[:, num_blocks:], axis=-1)


def _row_gumbels(seed_words, position, *, size: int):
    """[size] Gumbel noise of one row, keyed by fold_in(threefry key of its seed (hi, lo),
    position): the same for the same (seed, position) whatever the row or batch. One draw
    for all uses keeps the compiled program small (each threefry costs compile time)."""
    key = jax.random.wrap_key_data(seed_words, impl="threefry2x32")
    return jax.random.gumbel(jax.random.fold_in(key, position), (size,))


def _at(values, index):
    """values[r, index[r]] for values [R, X], index [R]."""
    return jnp.take_along_axis(values, index[:, None], axis=1)[:, 0]


def _top_k(x, k: int):
    """lax.top_k(x [R, V], k) with the same order (ties: lower id first). For small k, first
    keep the k blocks with the largest maxima (they hold every top-k id), then top-k over those
    k * _BLOCK values: ~8x faster than lax.top_k over V on CPU."""
    rows, vocab = x.shape
    if k > _SMALL_TOP_K or 4 * k * _BLOCK > vocab:
        return lax.top_k(x, k)
    pad = -vocab % _BLOCK
    blocks = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf).reshape(rows, -1, _BLOCK)
    _, chosen = lax.top_k(blocks.max(axis=-1), k)
    chosen = jnp.sort(chosen, axis=1)  # id order, so ties resolve as lax.top_k's do
    values, at = lax.top_k(jnp.take_along_axis(blocks, chosen[:, :, None], 1).reshape(rows, -1), k)
    return values, jnp.take_along_axis(chosen, at // _BLOCK, 1) * _BLOCK + at % _BLOCK
