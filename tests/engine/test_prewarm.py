"""Idle-time prewarm: every cheap executable runs once while nothing is queued, changes no
state (outputs and pages as without it), and gives way to requests."""

from __future__ import annotations

import time

from tests.engine.conftest import assert_pages_back, make_engine
from tests.engine.test_engine import greedy, ids, prompt
from tgix.engine.prewarm import Prewarmer


def _wait_warm(eng, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        assert eng._prewarm is not None, "a warm-up step failed (the engine logs why)"
        if eng._prewarm.done:
            return
        assert time.monotonic() < deadline, "prewarm did not finish"
        time.sleep(0.02)


def test_prewarm_runs_every_cheap_shape_once_and_changes_nothing(
    tiny_checkpoints, xla_cache, driver_greedy
):
    eng = make_engine(tiny_checkpoints("llama"), xla_cache, prewarm=True, chunked_prefill=True)
    try:
        _wait_warm(eng)
        buckets, ran = eng.runner.config.buckets, eng.runner.ran
        cheap = [s for s in buckets.model_shapes() if s.num_tokens <= 512]
        assert {("model", s) for s in cheap} <= ran
        assert {("sampler", s) for s in buckets.sampler_shapes()} <= ran
        assert {("mask", r) for r, _ in buckets.sampler_shapes()} <= ran
        prompts = [prompt(400 + i, 30 - 7 * i) for i in range(3)]
        streams = [eng.submit(greedy(8, prompt_ids=p)) for p in prompts]
        for p, s in zip(prompts, streams, strict=True):
            assert ids(list(s)[-1]) == driver_greedy(p, 8)  # KV writes went to page 0 only
        assert_pages_back(eng)
    finally:
        eng.shutdown()


def test_prewarm_goes_smallest_first_and_skips_what_serving_ran():
    class FakeRunner:
        def __init__(self):
            from tgix.engine.buckets import Buckets

            self.config = type("C", (), {})()
            self.config.buckets = Buckets.build(
                max_batch_prefill_tokens=1024, max_batch_size=4, max_total_tokens=1024, page_size=4
            )
            self.ran = set()

    runner = FakeRunner()
    warm = Prewarmer(runner, max_tokens=64)
    order = list(reversed(warm._todo))
    models = [key for kind, key in order if kind == "model"]
    assert [s.num_tokens for s in models] == sorted(s.num_tokens for s in models)
    assert max(s.num_tokens for s in models) == 64  # 96 and up are left to first use
    assert order[0][0] == "model" and order[-1][0] == "mask"
    runner.ran = {item for item in order if item[0] != "mask"}  # serving ran all but masks
    calls = []
    import tgix.engine.prewarm as prewarm

    saved = dict(prewarm._RUNS)
    prewarm._RUNS.update({k: (lambda r, key, k=k: calls.append((k, key))) for k in saved})
    try:
        while warm.step():
            pass
    finally:
        prewarm._RUNS.update(saved)
    assert calls and all(kind == "mask" for kind, _ in calls)
    assert warm.done and {c for c in calls} <= runner.ran
