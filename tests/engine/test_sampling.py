"""The on-device sampler against transformers' logits processors (the reference TGI's own
warpers reproduce), numpy/torch log-softmax, and statistical checks of the seeded draws."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from scipy import stats
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from tgix.engine import sampling
from tgix.engine.request import SamplingParams
from tgix.engine.sampling import CANDIDATES
from tgix.engine.sampling_host import pack_history, pack_sampling, seed_words

V = 512  # > CANDIDATES, so truncating warpers really work on a subset
HISTORY = 16
_sample = jax.jit(sampling.sample, static_argnames=("num_top", "vocab_limit"))


def run(logits, params, *, num_top=CANDIDATES, positions=None, histories=None, bucket=None,
        mask=None, **kw):  # fmt: skip
    """Sample rows of logits [n, V], one SamplingParams (or None) per row, in a bucket of
    max(8, n) rows (few shapes, few compiles) padded with neutral rows; numpy out for the n."""
    n = len(params)
    bucket = bucket or max(8, n)
    padded = np.zeros((bucket, np.shape(logits)[1]), np.float32)
    padded[:n] = logits
    out = _sample(
        jnp.asarray(padded),
        sampling.SamplingArrays.from_host(pack_sampling(params, bucket)),
        jnp.asarray(np.resize(np.arange(n) if positions is None else positions, bucket), jnp.int32),
        jnp.asarray(pack_history(histories or [], bucket, HISTORY)),
        num_top=num_top,
        vocab_limit=kw.pop("vocab_limit", np.shape(logits)[1]),
        token_mask=None if mask is None else jnp.asarray(np.resize(mask, padded.shape)),
        **kw,
    )
    return sampling.SampleOutput(*(np.asarray(a)[:n] for a in out))


def peaked_logits(rows, seed=0, vocab=V):
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * 3


def hf_probs(logits, params: SamplingParams, input_ids=None):
    """transformers' processors in TGI's order (a warper only when not neutral); [R, V]."""
    chain = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.is_sampling:
        if params.temperature != 1.0:
            chain.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k:
            chain.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            chain.append(TopPLogitsWarper(params.top_p))
        if params.typical_p < 1.0:
            chain.append(TypicalLogitsWarper(params.typical_p))
    ids = torch.zeros((len(logits), 0), dtype=torch.long) if input_ids is None else input_ids
    return torch.softmax(chain(ids, torch.tensor(logits)), dim=-1).numpy()


WARPERS = {
    "temperature": SamplingParams(temperature=0.7),
    "top_k": SamplingParams(temperature=1.3, top_k=20),
    "top_p": SamplingParams(top_p=0.8),
    "typical": SamplingParams(typical_p=0.5),
    "top_k+top_p": SamplingParams(temperature=2.0, top_k=10, top_p=0.7),
    "top_p+typical": SamplingParams(do_sample=True, top_p=0.6, typical_p=0.7),
    "all": SamplingParams(temperature=0.8, top_k=100, top_p=0.9, typical_p=0.9),
}


@pytest.mark.parametrize("name", WARPERS)
def test_warpers_match_transformers(name):
    params = WARPERS[name].with_seed(11)
    logits = peaked_logits(4, seed=1)
    out = run(logits, [params] * 4)
    expected = hf_probs(logits, params)
    for row in range(4):
        ids, probs = out.top_ids[row], np.exp(out.top_logprobs[row])
        assert len(set(ids)) == len(ids)
        np.testing.assert_allclose(probs, expected[row, ids], rtol=1e-4, atol=1e-6)
        if name == "temperature":  # untruncated: our top-K is the reference's top-K
            np.testing.assert_array_equal(
                np.sort(ids), np.sort(np.argsort(-expected[row])[:CANDIDATES])
            )
        else:  # same support: everything the reference keeps is among our finite candidates
            assert set(ids[probs > 0]) == set(np.flatnonzero(expected[row]))
            assert len(np.flatnonzero(expected[row])) < V / 2  # the check is not vacuous
        assert expected[row, out.token_ids[row]] > 0
        np.testing.assert_allclose(
            out.logprobs[row], np.log(expected[row, out.token_ids[row]]), rtol=1e-5, atol=1e-5
        )


def test_repetition_penalty_matches_transformers_and_frequency_presence_follow_openai():
    logits = peaked_logits(3, seed=2)
    histories = [[5, 9, 9, 300, 5, 9], [7, 7, 7, 100], [1, 2, 3]]
    params = [
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(repetition_penalty=0.7, frequency_penalty=0.5, presence_penalty=0.25),
        None,
    ]
    out = run(logits, params, histories=histories)
    for row, (p, hist) in enumerate(zip(params, histories, strict=True)):
        p = p or SamplingParams()
        expected = np.log(hf_probs(logits[row : row + 1], p, torch.tensor([hist]))[0])
        counts = np.bincount(hist, minlength=V)  # OpenAI: mu -= c * freq + (c > 0) * presence
        expected -= counts * p.frequency_penalty + (counts > 0) * p.presence_penalty
        expected -= np.logaddexp.reduce(expected)
        ids = out.top_ids[row]
        np.testing.assert_array_equal(np.sort(ids), np.sort(np.argsort(-expected)[:CANDIDATES]))
        np.testing.assert_allclose(out.top_logprobs[row], expected[ids], rtol=1e-5, atol=1e-5)
        assert out.token_ids[row] == np.argmax(expected)


def test_greedy_is_first_argmax_with_ties_and_top_n_sorted():
    rng = np.random.default_rng(3)
    logits = rng.integers(0, 12, size=(5, 2048)).astype(np.float32)  # many equal maxima
    reference = torch.log_softmax(torch.tensor(logits), dim=-1).numpy()
    for num_top in (0, 5):
        out = run(logits, [None] * 5, num_top=num_top)
        np.testing.assert_array_equal(out.token_ids, np.argmax(logits, axis=1))
        np.testing.assert_allclose(
            out.logprobs, reference[np.arange(5), out.token_ids], rtol=1e-6, atol=1e-6
        )
        assert out.top_ids.shape == out.top_logprobs.shape == (5, num_top)
        stable_order = np.argsort(-logits, axis=1, kind="stable")[:, :num_top]
        np.testing.assert_array_equal(out.top_ids, stable_order)
        np.testing.assert_allclose(
            out.top_logprobs, np.take_along_axis(reference, stable_order, 1), rtol=1e-6
        )


def test_seeded_draw_depends_on_seed_and_position_only():
    logits = np.zeros((8, V), np.float32)  # uniform: every draw is informative
    logits[:, :40] = np.random.default_rng(4).normal(size=40)
    request = SamplingParams(do_sample=True, seed=2**63 + 12345)
    cut = SamplingParams(top_k=30, seed=2**63 + 12345)
    mates = [None, SamplingParams(temperature=0.5, seed=1), SamplingParams(top_p=0.5, seed=2)]
    for params in (request, cut):
        alone = run(logits[:1], [params], positions=[17], bucket=1)
        batch = run(logits, mates + [params] * 5, positions=[3, 9, 17, 17, 5, 6, 7, 8])
        assert batch.token_ids[3] == alone.token_ids[0]
        np.testing.assert_allclose(batch.logprobs[3], alone.logprobs[0], rtol=1e-6)
        later = [run(logits[:1], [params], positions=[p]).token_ids[0] for p in range(18, 30)]
        assert len(set(later)) > 6  # new position, new draw
        reseeded = [
            run(logits[:1], [params.with_seed(s)], positions=[17]).token_ids[0] for s in range(12)
        ]
        assert len(set(reseeded)) > 6


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=0.9, top_k=8), SamplingParams(temperature=1.4)]
)
def test_draws_follow_the_processed_distribution(params):
    rows, steps = 64, 50
    logits = np.full((rows, V), -30.0, np.float32)  # few live tokens, spread over id blocks
    live = np.array([3, 40, 77, 130, 131, 200, 311, 400, 450, 509])
    logits[:, live] = np.linspace(1.5, -1.0, len(live))
    expected = hf_probs(logits[:1], params)[0]
    batch = [params.with_seed(1000 + r) for r in range(rows)]
    draws = np.concatenate(
        [run(logits, batch, num_top=0, positions=np.full(rows, t)).token_ids for t in range(steps)]
    )
    support = np.flatnonzero(expected > 1e-9)
    assert np.isin(draws, support).all()
    observed = np.bincount(draws, minlength=V)[support]
    expected_counts = expected[support].astype(np.float64)
    expected_counts *= len(draws) / expected_counts.sum()
    assert stats.chisquare(observed, expected_counts).pvalue > 1e-3
    assert stats.chisquare(observed, np.full(len(support), len(draws) / len(support))).pvalue < 1e-6


def test_vocab_limit_and_token_mask():
    limit = V - 12
    logits = peaked_logits(4, seed=5)
    logits[:, limit:] = 100.0  # model vocab padding that must never win
    allowed = np.zeros((4, V), bool)
    rng = np.random.default_rng(5)
    for row in range(4):
        allowed[row, rng.choice(limit, 10, replace=False)] = True
    allowed[:, limit:] = True
    params = [None, SamplingParams(do_sample=True, seed=1), SamplingParams(top_k=3, seed=2), None]
    plain = run(logits, params, vocab_limit=limit)
    assert (plain.token_ids < limit).all() and (plain.top_ids < limit).all()
    reference = torch.log_softmax(torch.tensor(logits[:, :limit]), dim=-1).numpy()
    assert plain.token_ids[0] == np.argmax(logits[0, :limit])
    np.testing.assert_allclose(plain.logprobs[0], reference[0, plain.token_ids[0]], rtol=1e-6)

    masked = run(logits, params, vocab_limit=limit, mask=allowed)
    for row in range(4):
        assert allowed[row, masked.token_ids[row]] and masked.token_ids[row] < limit
        finite = masked.top_ids[row][np.isfinite(masked.top_logprobs[row])]
        assert len(finite) == (3 if row == 2 else 10)  # top_k=3 narrows the allowed ten
        assert set(finite) <= set(np.flatnonzero(allowed[row, :limit]))
        np.testing.assert_allclose(np.exp(masked.top_logprobs[row]).sum(), 1.0, rtol=1e-5)
    allowed_ids = np.flatnonzero(allowed[0, :limit])
    assert masked.token_ids[0] == allowed_ids[np.argmax(logits[0, allowed_ids])]


def test_watermark_adds_delta_to_the_green_list_of_the_previous_token():
    vocab = 4096
    prev = jnp.asarray([0, 1, 2, 77, 4095], jnp.int32)
    green = np.asarray(sampling.watermark_green_mask(prev, vocab, 0.5))
    assert abs(green.mean() - 0.5) < 0.01
    assert (green[:-1] != green[1:]).mean() > 0.4  # a different list per previous token
    assert np.asarray(sampling.watermark_green_mask(prev, vocab, 0.25)).mean() < 0.27

    logits = peaked_logits(2, seed=6) / 3
    histories = [[8, 9, 42], [8, 9, 42]]
    out = run(logits, [SamplingParams(watermark=True), None], histories=histories)
    green42 = np.asarray(sampling.watermark_green_mask(jnp.asarray([42]), V, 0.5))[0]
    expected = torch.log_softmax(torch.tensor(logits[0] + 2.0 * green42), dim=-1).numpy()
    np.testing.assert_allclose(out.top_logprobs[0], expected[out.top_ids[0]], rtol=1e-5, atol=1e-5)
    assert out.top_ids[0][0] == np.argmax(expected)
    assert out.token_ids[1] == np.argmax(logits[1])  # its batch mate is untouched

    rows = 64  # sampled text: the green share rises from gamma to ~e^2 / (e^2 + 1)
    flat = peaked_logits(rows, seed=7) / 6
    prevs = [[int(t)] for t in np.random.default_rng(7).integers(0, V, rows)]
    shares = {}
    for mark in (False, True):
        batch = [SamplingParams(do_sample=True, watermark=mark, seed=r) for r in range(rows)]
        toks = run(flat, batch, num_top=0, histories=prevs).token_ids
        lists = np.asarray(sampling.watermark_green_mask(jnp.asarray(prevs)[:, 0], V, 0.5))
        shares[mark] = lists[np.arange(rows), toks].mean()
    assert shares[False] < 0.7 and shares[True] > 0.75


def test_each_row_gets_the_same_result_alone_as_in_a_mixed_batch():
    rows = [
        None,
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=3),
        SamplingParams(typical_p=0.8, seed=4),
        SamplingParams(do_sample=True, watermark=True, seed=5),
        SamplingParams(temperature=1.2, seed=6),
        SamplingParams(top_p=0.7, repetition_penalty=1.2, presence_penalty=0.5, seed=7),
        None,
    ]
    logits = peaked_logits(8, seed=8)
    histories = [list(range(r, r + 2 * r + 1)) for r in range(8)]
    positions = np.arange(8) * 3 + 1
    batch = run(logits, rows, positions=positions, histories=histories)
    for r, params in enumerate(rows):
        alone = run(logits[r : r + 1], [params], positions=positions[r : r + 1],
                    histories=histories[r : r + 1], bucket=1)  # fmt: skip
        assert alone.token_ids[0] == batch.token_ids[r], r
        np.testing.assert_array_equal(alone.top_ids[0], batch.top_ids[r])
        np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[r], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(alone.top_logprobs[0], batch.top_logprobs[r], rtol=1e-6)


def test_prompt_scores_match_torch_log_softmax():
    logits, ids = peaked_logits(6, seed=9), np.array([0, 5, 499, 100, 7, 7])
    for limit in (None, 500):  # 500: the normaliser leaves out the model's padding ids
        call = jax.jit(partial(sampling.prompt_scores, num_top=3, vocab_limit=limit))
        got, top_ids, top_lp = map(np.asarray, call(jnp.asarray(logits), jnp.asarray(ids)))
        reference = torch.log_softmax(torch.tensor(logits[:, :limit]), -1)
        want = reference.numpy()[np.arange(6), ids]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        ref_lp, ref_ids = torch.topk(reference, 3, dim=-1)
        np.testing.assert_array_equal(top_ids, ref_ids.numpy())
        np.testing.assert_allclose(top_lp, ref_lp.numpy(), rtol=1e-6, atol=1e-6)
        assert top_ids.dtype == np.int32 and top_ids.shape == (6, 3)


def test_pack_sampling_rows_and_seeds():
    packed = pack_sampling(
        [SamplingParams(temperature=0.5, seed=2**64 - 1), None, SamplingParams(top_k=3, seed=9)],
        num_rows=4,
    )
    assert packed["do_sample"].tolist() == [True, False, True, False]  # TGI's effective rule
    assert packed["temperature"].tolist() == [0.5, 1.0, 1.0, 1.0]
    assert packed["top_k"].tolist() == [0, 0, 3, 0] and packed["top_k"].dtype == np.int32
    assert packed["seed"].dtype == np.uint32 and packed["seed"].tolist()[0] == [2**32 - 1] * 2
    assert set(packed) == {f.name for f in dataclasses.fields(sampling.SamplingArrays)}
    with pytest.raises(ValueError, match="seed"):
        pack_sampling([SamplingParams(do_sample=True)], 1)
    for seed in (0, 7, 2**31 - 1):  # the words jax.random.PRNGKey derives from the seed
        assert list(seed_words(seed)) == np.asarray(jax.random.PRNGKey(seed)).tolist()
    assert seed_words(2**40 + 3) == (2**8, 3)


def test_pack_history_keeps_the_last_ids():
    history = pack_history([[1, 2, 3, 4, 5], [6], []], num_rows=4, length=3)
    assert history.tolist() == [[3, 4, 5], [6, -1, -1], [-1, -1, -1], [-1, -1, -1]]
    assert history.dtype == np.int32
