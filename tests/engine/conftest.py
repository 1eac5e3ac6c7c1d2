"""A compiled engine on the tiny llama checkpoint, shared by the engine tests of a module."""

from __future__ import annotations

import time

import numpy as np
import pytest

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
    """Every test that uses an engine ends with all its pages free."""
    if "engine" not in request.fixturenames:
        yield
        return
    eng = request.getfixturevalue("engine")
    free_before = wait_idle(eng)["free_pages"]
    yield
    assert wait_idle(eng)["free_pages"] == free_before == eng.runner.config.num_pages - 1


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
