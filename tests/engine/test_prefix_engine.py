"""Prefix caching end to end on the tiny checkpoint: greedy ids with caching on equal the ids
with caching off (and the model forward's) for repeated prompts, prefixes of 1, 2 and 10 full
pages, 8 concurrent requests on one prefix and an evicted prefix (preempted requests: in
test_engine_modes' page-pressure test); the cache counts what it served; best_of's second
sequence reads the first one's prompt pages."""

from __future__ import annotations

import pytest

from tests.engine.conftest import assert_pages_back, make_engine, wait_idle
from tests.engine.test_engine import greedy, ids, prompt, run
from tgix.attention import pack
from tgix.engine.request import Completion, SamplingParams

PAGE = 4  # tests/engine/conftest.py LIMITS


@pytest.fixture(scope="module")
def uncached(tiny_checkpoints, xla_cache):
    eng = make_engine(tiny_checkpoints("llama"), xla_cache, prefix_caching=False)
    yield eng
    try:
        assert_pages_back(eng)
        assert wait_idle(eng)["cached_pages"] == 0
    finally:
        eng.shutdown()


def hits(engine) -> int:
    return wait_idle(engine)["prefix_hit_tokens"]


def both(engine, uncached, prompt_ids, n=8) -> list[int]:
    on, off = ids(run(engine, greedy(n, prompt_ids=prompt_ids))), None
    off = ids(run(uncached, greedy(n, prompt_ids=prompt_ids)))
    assert on == off
    return on


def test_caching_off_never_hits(uncached):
    p = prompt(1, 21)
    assert ids(run(uncached, greedy(4, prompt_ids=p))) == ids(
        run(uncached, greedy(4, prompt_ids=p))
    )
    s = wait_idle(uncached)
    assert (s["prefix_hit_tokens"], s["cached_pages"]) == (0, 0)


def test_same_prompt_twice(engine, uncached, driver_greedy):
    p = prompt(2, 23)  # 5 full pages
    first = both(engine, uncached, p)
    before = hits(engine)
    assert both(engine, uncached, p) == first == driver_greedy(p, 8)
    assert hits(engine) - before == 20  # 5 pages; the last token is computed


@pytest.mark.parametrize("pages", [1, 2, 10])
def test_prompts_sharing_full_pages_then_diverging(engine, uncached, pages):
    base = prompt(30 + pages, 4 * pages + 9)
    both(engine, uncached, base)
    before = hits(engine)
    diverging = base[: 4 * pages] + prompt(60 + pages, 6)
    assert diverging[4 * pages] != base[4 * pages]
    both(engine, uncached, diverging)
    assert hits(engine) - before == 4 * pages


def test_a_prefix_shared_by_8_concurrent_requests(engine, uncached, driver_greedy, monkeypatch):
    shared, find = [], pack.shared_prefix_pages  # (rows, pages) of every step packed

    def recorded(rows, page_size):
        shared.append(found := find(rows, page_size))
        return found

    monkeypatch.setattr(pack, "shared_prefix_pages", recorded)
    prefix = prompt(7, 40)  # 10 full pages
    prompts = [prefix + prompt(70 + i, 1 + i) for i in range(8)]
    before = hits(engine)
    streams = [engine.submit(greedy(6, prompt_ids=p)) for p in prompts]
    for p, s in zip(prompts, streams, strict=True):
        assert ids(list(s)[-1]) == driver_greedy(p, 6)
    assert hits(engine) - before >= 7 * 40  # one computed the prefix, the others read it
    # decode steps read the prefix's pages once for all their rows (attention.shared_prefix)
    assert any(len(rows) >= 4 and pages >= 10 for rows, pages in shared)
    for p in prompts[:2]:
        assert ids(run(uncached, greedy(6, prompt_ids=p))) == driver_greedy(p, 6)


def test_an_evicted_prefix_is_recomputed(engine, uncached):
    p = prompt(8, 33)
    first = both(engine, uncached, p)
    evicted = wait_idle(engine)["prefix_evictions"]
    pool_tokens = engine.runner.config.num_pages * PAGE
    for i in range(pool_tokens // 80 + 2):  # distinct prompts fill the pool past capacity
        run(engine, greedy(2, prompt_ids=prompt(800 + i, 85)))
    assert wait_idle(engine)["prefix_evictions"] > evicted
    before = hits(engine)
    assert ids(run(engine, greedy(8, prompt_ids=p))) == first
    assert hits(engine) - before < 32  # its pages were evicted (the LRU's first)


def test_best_of_reads_the_prompt_pages_once(engine):
    p = prompt(9, 26)  # 6 full pages
    before = hits(engine)
    sampling = SamplingParams(do_sample=True, temperature=0.9)
    *_, final = engine.submit(greedy(5, prompt_ids=p, best_of=2, sampling=sampling))
    assert isinstance(final, Completion) and len(final.best_of_sequences) == 1
    assert hits(engine) - before == 24  # the second sub-request held the first's 6 pages
