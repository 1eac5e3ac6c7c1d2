"""Engine configurations beyond the default: page pressure (preemption), chunked prefill,
extra EOS ids and prompt logprobs, each checked against the model forward or transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.engine.conftest import assert_pages_back, make_engine, wait_idle
from tests.engine.test_engine import greedy, ids, prompt, run
from tgix import testing


def _pages_back(eng):
    assert_pages_back(eng)


def _assert_driver_ids(eng, prompts, n, driver_greedy):
    """Submitted together, each prompt gets the model forward's greedy ids; pages come back."""
    streams = [eng.submit(greedy(n, prompt_ids=p)) for p in prompts]
    for p, s in zip(prompts, streams, strict=True):
        assert ids(list(s)[-1]) == driver_greedy(p, n)
    _pages_back(eng)


def test_page_pressure_preempts_and_every_request_finishes_exactly(
    tiny_checkpoints, xla_cache, driver_greedy
):
    """16 pages of 4 tokens for 4 requests that each end at 40 tokens: they cannot all hold
    their pages at once, so the youngest are preempted and recomputed (on their cached pages);
    none fails, and each gets exactly the ids it gets alone."""
    eng = make_engine(
        tiny_checkpoints("llama"),
        xla_cache,
        max_batch_total_tokens=64,
        max_total_tokens=48,
        max_batch_prefill_tokens=48,
    )
    try:
        prompts = [prompt(200 + i, 20) for i in range(4)]
        _assert_driver_ids(eng, prompts, 20, driver_greedy)
        assert eng.scheduler.stats()["preemptions"] > 0
        # recomputing, they started past whatever of their pages the prefix cache still held
        assert wait_idle(eng)["prefix_hit_tokens"] > 0
    finally:
        eng.shutdown()


def test_chunked_prefill_gives_the_same_ids(tiny_checkpoints, xla_cache, driver_greedy):
    """A 16-token prefill budget splits 40-token prompts over several mixed steps."""
    eng = make_engine(
        tiny_checkpoints("llama"),
        xla_cache,
        chunked_prefill=True,
        max_batch_prefill_tokens=16,
    )
    try:
        prompts = [prompt(300 + i, 40 - 9 * i) for i in range(3)]
        _assert_driver_ids(eng, prompts, 10, driver_greedy)
    finally:
        eng.shutdown()


def test_tensor_parallel_mesh_gives_the_same_ids(tiny_checkpoints, xla_cache, driver_greedy):
    """Weights and KV pages split over 4 devices on the "model" axis (the 2 KV heads repeated
    to 4): the same greedy ids as the single-device forward, the same executables as one
    device, nothing compiled while serving, every page back."""
    import jax

    from tgix.sharding import make_mesh

    prompts = [prompt(500 + i, 5 + 7 * i) for i in range(3)]
    expected = [driver_greedy(p, 10) for p in prompts]
    eng = make_engine(tiny_checkpoints("llama"), xla_cache, mesh=make_mesh(model=4))
    single = make_engine(tiny_checkpoints("llama"), xla_cache)
    compiles = []
    listener = lambda event, duration, **kw: compiles.append(event)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert eng.runner.kv[0].k.sharding.spec[2] == "model"
        assert eng.runner.kv[0].k.shape[2] == 4
        assert len(eng.runner.executables) == len(single.runner.executables)
        streams = [eng.submit(greedy(10, prompt_ids=p)) for p in prompts]
        assert [ids(list(s)[-1]) for s in streams] == expected
        assert not [e for e in compiles if e.startswith("/jax/core/compile")]
        _pages_back(eng)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        eng.shutdown()
        single.shutdown()


@pytest.mark.reference
def test_every_eos_id_stops_and_prompt_logprobs_match_transformers(
    tiny_checkpoints, xla_cache, driver_greedy
):
    path = tiny_checkpoints("llama")
    p = prompt(400, 9)
    free = driver_greedy(p, 8)
    eos_a, eos_b = free[3], free[5]  # two extra EOS ids; the earlier one must end it
    eng = make_engine(path, xla_cache, extra_eos_ids=(eos_b, eos_a), prompt_logprobs=True)
    try:
        c = run(eng, greedy(8, prompt_ids=p, prompt_logprobs=True, top_n_tokens=3))
        assert c.finish_reason == "eos_token" and ids(c) == free[:4]
        assert run(eng, greedy(8, prompt_ids=p, ignore_eos=True)).generated_tokens == 8
        model = testing.load_reference_model(path)
        with torch.no_grad():
            logits = model(torch.tensor([p])).logits[0].float()
        want_all = torch.log_softmax(logits[:, : testing.TOKENIZER_VOCAB_SIZE], -1)
        want = [float(want_all[j, p[j + 1]]) for j in range(len(p) - 1)]
        assert [t.id for t in c.prefill] == list(p)
        assert c.prefill[0].logprob is None
        np.testing.assert_allclose([t.logprob for t in c.prefill[1:]], want, atol=1e-4)
        # each prompt position's top-3 alternatives (OpenAI completions' echo + logprobs)
        top_lp, top_ids = torch.topk(want_all, 3, dim=-1)
        assert len(c.prefill_top_tokens) == len(p) and c.prefill_top_tokens[0] == ()
        got_ids = [[t.id for t in tops] for tops in c.prefill_top_tokens[1:]]
        assert got_ids == top_ids[:-1].tolist()
        got_lp = [[t.logprob for t in tops] for tops in c.prefill_top_tokens[1:]]
        np.testing.assert_allclose(got_lp, top_lp[:-1].numpy(), atol=1e-4)
        _pages_back(eng)
    finally:
        eng.shutdown()


_RESTART = """
import json, sys
sys.path.insert(0, {root!r})
from tests.engine.conftest import make_engine
from tgix.engine.request import GenerationRequest
# the fewest shapes that still serve a prompt and its decode (each is compiled cold once)
eng = make_engine({path!r}, {cache!r}, prefix_caching=False, max_batch_size=2,
                  max_total_tokens=32, max_batch_prefill_tokens=32)
*_, c = eng.submit(GenerationRequest(prompt_ids=(5, 9, 12, 40), max_new_tokens=12))
ex = eng.runner.executables.cache
print(json.dumps({{"ids": [t.id for t in c.tokens], "hits": ex.hits, "misses": ex.misses}}))
eng.shutdown()
"""


def test_a_new_process_loads_saved_executables_and_gets_the_same_ids(tiny_checkpoints, tmp_path):
    """The warm-restart path for real: a second process compiles nothing and still runs every
    step it needs (an incompletely serialized executable fails only when run)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = _RESTART.format(root=root, path=str(tiny_checkpoints("llama")), cache=str(tmp_path))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["misses"] > 0 and cold["hits"] == 0
    assert warm["misses"] == 0 and warm["hits"] == cold["misses"]
    assert warm["ids"] == cold["ids"] and len(cold["ids"]) == 12
