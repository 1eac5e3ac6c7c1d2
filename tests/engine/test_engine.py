"""The engine end to end on a tiny checkpoint: exact greedy ids against the paged model driver,
batch invariance, seeded reproducibility, stops, cancel, failure isolation, no recompiles."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.compiles import recording_compiles
from tests.engine.conftest import make_engine, wait_idle
from tgix import testing
from tgix.engine.request import Completion, GenerationError, GenerationRequest, SamplingParams

VOCAB = testing.TOKENIZER_VOCAB_SIZE  # the engine never samples the model's padding ids


def prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(3, VOCAB, n))


def run(engine, request: GenerationRequest) -> Completion:
    *_, final = engine.submit(request)
    return final


def ids(c: Completion) -> list[int]:
    return [t.id for t in c.tokens]


def greedy(n_new: int, **kw) -> GenerationRequest:
    return GenerationRequest(max_new_tokens=n_new, **kw)


def test_greedy_ids_equal_the_model_forward(engine, driver_greedy):
    """Also while decode steps overlap (the next step is sent before this one is read)."""
    overlapped = wait_idle(engine)["overlapped_steps"]
    for seed, n in ((0, 5), (1, 17), (2, 40)):
        p = prompt(seed, n)
        c = run(engine, greedy(12, prompt_ids=p))
        assert ids(c) == driver_greedy(p, 12)
        assert c.finish_reason == "length" and c.generated_tokens == 12 and c.seed is None
        assert c.generated_text == engine.tokenizer.decode(ids(c), skip_special_tokens=True)
    assert wait_idle(engine)["overlapped_steps"] >= overlapped + 3 * 9


@pytest.mark.parametrize("others", [1, 3, 7])
def test_batch_invariance_when_joining_mid_decode(engine, others):
    """A greedy request gives the same ids alone and when 1-7 requests of other lengths and
    sampling settings run beside it, some admitted before it and some while it decodes."""
    target = greedy(30, prompt_ids=prompt(10, 9))
    alone = ids(run(engine, target))
    settings = [
        SamplingParams(),
        SamplingParams(do_sample=True, seed=5, top_k=7, top_p=0.9),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingParams(temperature=0.7, seed=9, typical_p=0.8),
        SamplingParams(presence_penalty=1.0, watermark=True),
    ]
    before = [
        engine.submit(
            greedy(20 + i, prompt_ids=prompt(20 + i, 3 + 7 * i), sampling=settings[i % 5])
        )
        for i in range(others // 2)
    ]
    stream = engine.submit(target)
    got = []
    after = []
    for event in stream:
        if isinstance(event, Completion):
            break
        got.append(event.token.id)
        if len(got) == 3:  # join while the target decodes
            after = [
                engine.submit(
                    greedy(15 + i, prompt_ids=prompt(40 + i, 2 + 5 * i), sampling=settings[-i % 5])
                )
                for i in range(others - len(before))
            ]
    for s in before + after:
        *_, last = s
        assert isinstance(last, Completion)
    assert got == alone


def test_seeded_sampling_is_reproducible_alone_among_others_and_after_restart(
    engine, tiny_checkpoints, xla_cache
):
    req = greedy(
        20,
        prompt_ids=prompt(3, 11),
        sampling=SamplingParams(do_sample=True, seed=1234, temperature=1.3, top_k=50),
    )
    alone = run(engine, req)
    assert alone.seed == 1234
    crowd = [engine.submit(greedy(25, prompt_ids=prompt(60 + i, 4 + i))) for i in range(5)]
    among = run(engine, req)
    for s in crowd:
        list(s)
    assert ids(among) == ids(alone)
    other_seed = run(
        engine, greedy(20, prompt_ids=req.prompt_ids, sampling=req.sampling.with_seed(7))
    )
    assert ids(other_seed) != ids(alone)
    restarted = make_engine(tiny_checkpoints("llama"), xla_cache)
    try:
        assert ids(run(restarted, req)) == ids(alone)
    finally:
        restarted.shutdown()


def test_stop_sequence_spanning_tokens_cuts_exactly(engine):
    p = prompt(4, 6)
    free = run(engine, greedy(30, prompt_ids=p))
    texts = [t.text for t in free.tokens]
    # a stop made of the end of token i, all of token i+1 and the start of token i+2
    i = next(
        i
        for i in range(2, 25)
        if all(texts[i : i + 3]) and "\ufffd" not in texts[i][-1:] + texts[i + 1] + texts[i + 2][:1]
    )
    stop = texts[i][-1:] + texts[i + 1] + texts[i + 2][:1]
    full = "".join(texts)
    end = full.index(stop) + len(stop)
    stream = engine.submit(greedy(30, prompt_ids=p, stop=(stop, "never-matches")))
    events = list(stream)
    final = events[-1]
    assert final.finish_reason == "stop_sequence" and final.stop_sequence == stop
    assert final.generated_text == full[:end]
    assert "".join(e.token.text for e in events[:-1]) == final.generated_text
    assert [e.index for e in events[:-1]] == list(range(1, len(events)))
    assert final.generated_tokens == len(final.tokens) <= i + 3


def test_top_n_tokens_are_the_best_alternatives(engine):
    c = run(engine, greedy(5, prompt_ids=prompt(5, 7), top_n_tokens=3))
    for token, tops in zip(c.tokens, c.top_tokens, strict=True):
        assert len(tops) == 3
        assert tops[0].id == token.id and tops[0].logprob == pytest.approx(token.logprob)
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)


def test_best_of_returns_the_highest_mean_logprob(engine):
    req = greedy(8, prompt_ids=prompt(6, 5), sampling=SamplingParams(do_sample=True), best_of=3)
    c = run(engine, req)
    mean = lambda x: np.mean([t.logprob for t in x.tokens])
    assert len(c.best_of_sequences) == 2
    assert all(mean(c) >= mean(o) for o in c.best_of_sequences)
    assert len({c.seed, *(o.seed for o in c.best_of_sequences)}) == 3


def test_requests_over_the_token_limits_are_refused(engine):
    with pytest.raises(GenerationError, match="must be <= 96. Given: 90 `inputs` tokens and 7"):
        run(engine, greedy(7, prompt_ids=prompt(1, 90)))
    with pytest.raises(GenerationError, match="must have less than 95 tokens. Given: 96"):
        run(engine, greedy(1, prompt_ids=prompt(1, 96)))


def test_a_malformed_request_ends_alone_and_the_engine_keeps_serving(engine):
    """A programmatic caller's prompt of strings (the server never sends one): that request
    gets a validation error; the engine loop survives and serves the next request."""
    with pytest.raises(GenerationError, match="invalid request") as err:
        run(engine, greedy(3, prompt_ids=("input_ids", "attention_mask")))
    assert err.value.error_type == "validation"
    assert engine.healthy()
    assert len(ids(run(engine, greedy(3, prompt_ids=prompt(2, 5))))) == 3


def test_cancel_frees_pages_and_ends_the_stream(engine):
    stream = engine.submit(greedy(80, prompt_ids=prompt(7, 10)))
    it = iter(stream)
    next(it), next(it)
    stream.cancel()
    with pytest.raises(GenerationError) as err:
        list(it)
    assert err.value.error_type == "cancelled"


def test_failing_step_ends_only_its_requests(engine, driver_greedy, monkeypatch):
    """A step that raises (after destroying the donated KV pages) fails the request that
    triggered it; the other request recomputes and finishes with its exact greedy ids."""
    poison = VOCAB - 1
    original = engine.runner.run

    def run_or_fail(rows, sampling, **kw):
        if any(poison in r.token_ids for r in rows):
            for layer in engine.runner.kv:
                layer.k.delete()
            raise RuntimeError("injected device failure")
        return original(rows, sampling, **kw)

    good = prompt(8, 12)
    good_stream = engine.submit(greedy(20, prompt_ids=good))
    it = iter(good_stream)
    first = [next(it).token.id for _ in range(3)]
    monkeypatch.setattr(engine.runner, "run", run_or_fail)
    with pytest.raises(GenerationError, match="injected device failure"):
        run(engine, greedy(5, prompt_ids=(5, poison, 6)))
    rest = [e.token.id for e in it if not isinstance(e, Completion)]
    assert first + rest == driver_greedy(good, 20)
    assert engine.healthy()


def test_non_finite_logits_end_only_that_request(engine, monkeypatch):
    original = engine.runner.run
    marker = VOCAB - 2

    def nan_for_marked(rows, sampling, **kw):
        out = original(rows, sampling, **kw)
        bad = [i for i, r in enumerate(rows) if r.token_ids[0] == marker]
        if not bad:
            return out
        return out._replace(logprobs=out.logprobs.at[bad[0]].set(np.nan))

    monkeypatch.setattr(engine.runner, "run", nan_for_marked)
    ok = engine.submit(greedy(6, prompt_ids=prompt(9, 4)))
    with pytest.raises(GenerationError, match="non-finite"):
        run(engine, greedy(6, prompt_ids=(marker, 5, 6)))
    *_, final = ok
    assert final.generated_tokens == 6


def test_watchdog_reports_a_stalled_step(engine, monkeypatch):
    assert engine.healthy()
    original = engine.runner.run
    release = threading.Event()

    def slow(rows, sampling, **kw):
        release.wait(5)
        return original(rows, sampling, **kw)

    monkeypatch.setattr(engine, "_stall_timeout", 0.05)
    monkeypatch.setattr(engine.runner, "run", slow)
    stream = engine.submit(greedy(2, prompt_ids=(5, 6)))
    time.sleep(0.3)
    assert not engine.healthy()
    release.set()
    list(stream)
    assert engine.healthy()


def test_mixed_traffic_after_warmup_compiles_nothing(engine):
    with recording_compiles() as compiles:
        streams = [
            engine.submit(
                greedy(
                    3 + 4 * i,
                    prompt_ids=prompt(100 + i, 1 + 9 * i),
                    sampling=SamplingParams(
                        do_sample=i % 2 == 1, seed=i, repetition_penalty=1.0 + 0.1 * (i % 3)
                    ),
                    top_n_tokens=i % 4,
                )
            )
            for i in range(8)
        ]
        for s in streams:
            list(s)
        # cache hits: prompts starting with the last one's 64 tokens (16 full pages), with
        # and without decode rows beside them
        hits = wait_idle(engine)["prefix_hit_tokens"]
        shared = prompt(107, 64)
        streams = [
            engine.submit(greedy(4 + i, prompt_ids=shared[: 8 + 8 * i] + prompt(300 + i, 2 + i)))
            for i in range(6)
        ]
        for s in streams:
            list(s)
    assert compiles == []
    assert wait_idle(engine)["steps"] > 0
    assert wait_idle(engine)["prefix_hit_tokens"] - hits >= sum(8 + 8 * i for i in range(6))
