"""A compiled engine on the tiny llama checkpoint, shared by the engine tests of a module."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.engine.fake_device import Device

LIMITS = dict(
    max_total_tokens=96,
    max_batch_prefill_tokens=96,
    max_batch_total_tokens=1024,
    max_batch_size=8,
    page_size=4,
)


@pytest.fixture(scope="session")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


def make_engine(path, xla_cache, *, extra_eos_ids=(), mesh=None, **overrides):
    from tgix.engine.factory import EngineOptions, create_engine
    from tgix.engine.limits import LimitRequest
    from tgix.models import load_model
    from tgix.tokenizer import load_tokenizer

    loaded = load_model(str(path), mesh=mesh)
    tokenizer = load_tokenizer(loaded.files, extra_eos_ids=extra_eos_ids)
    options = dict(compilation_cache=xla_cache, progress=False, max_top_n_tokens=3)
    options.update(
        {k: overrides.pop(k) for k in list(overrides) if k in EngineOptions.__annotations__}
    )
    limits = LimitRequest(**{**LIMITS, **overrides})
    return create_engine(loaded, tokenizer, limits, EngineOptions(**options))


def wait_idle(engine, timeout=10.0):
    """Until nothing is queued or running and every page is back (the engine refreshes its
    stats after each step and while idle)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s and s["queue_size"] == 0 and s["batch_size"] == 0 and s["used_pages"] == 0:
            return s
        time.sleep(0.01)
    raise AssertionError(f"engine not idle: {engine.stats()}")


@pytest.fixture(scope="module")
def engine(tiny_checkpoints, xla_cache):
    eng = make_engine(tiny_checkpoints("llama"), xla_cache)
    yield eng
    eng.shutdown()


@pytest.fixture(autouse=True)
def pages_return(request):
    """Every test that uses an engine ends with all its pages free or cached."""
    if "engine" not in request.fixturenames:
        yield
        return
    eng = request.getfixturevalue("engine")
    wait_idle(eng)
    yield
    assert_pages_back(eng)


def assert_pages_back(eng):
    """Idle, and every page free or cached: none held, no reference count above zero."""
    s = wait_idle(eng)
    assert s["free_pages"] + s["cached_pages"] == eng.runner.config.num_pages - 1
    kv = eng.scheduler.kv
    assert all(kv.refcount(p) == 0 for p in range(kv.num_pages))


def release_engines(engines) -> None:
    """A module fixture's teardown: every engine has its pages back, then all shut down."""
    try:
        for eng in engines:
            assert_pages_back(eng)
    finally:
        for eng in engines:
            eng.shutdown()


@pytest.fixture(scope="module")
def driver_greedy(tiny_checkpoints):
    """Greedy ids straight from the model forward (no engine), over the tokenizer's vocab."""
    from tests.paged import PagedDriver
    from tgix import testing
    from tgix.models import load_model

    loaded = load_model(str(tiny_checkpoints("llama")))
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=4, num_pages=64)

    def continue_(prompt_ids, n):
        out, feed = [], list(prompt_ids)
        for _ in range(n):
            logits = driver.step({"r": feed})["r"]
            feed = [int(np.argmax(logits[: testing.TOKENIZER_VOCAB_SIZE]))]
            out += feed
        driver.release("r")
        return out

    return continue_


@pytest.fixture
def make():
    """Scheduler + Device factory; at teardown every page must be back in the pool."""
    made = []

    from tgix.engine.kv_manager import KVManager
    from tgix.engine.scheduler import Scheduler, SchedulerConfig

    def make(num_pages: int, page_size: int, caching: bool = False, **config) -> Device:
        pool = KVManager(num_pages, page_size, prefix_caching=caching)
        made.append(pool)
        return Device(Scheduler(SchedulerConfig(**config), pool))

    yield make
    for pool in made:  # every page free or cached, none held
        assert (pool.num_free + pool.num_cached, pool.num_used) == (pool.num_pages - 1, 0)
        assert all(pool.refcount(p) == 0 for p in range(pool.num_pages))
