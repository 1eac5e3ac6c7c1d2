"""Data-parallel replicas in one process: routing, merged stats, and real engines on
separate device slices giving the model's greedy ids."""

from __future__ import annotations

from tests.engine.conftest import LIMITS, wait_idle
from tests.engine.test_engine import greedy, ids, prompt
from tgix.engine.replicas import Replicas


class FakeEngine:
    def __init__(self, name, load=0):
        self.name, self.load, self.submitted, self.cancelled = name, load, [], []
        self.tokenizer = self.limits = self.grammar_compiler = None
        self.model_id = "m"
        self.speculate = 3  # --speculate, reported by /info
        self.ok = True

    def stats(self):
        return {"queue_size": self.load, "batch_size": 1, "steps": 10, "host_gap_ms_median": 2}

    def submit(self, request):
        self.submitted.append(request)
        return self.name

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def healthy(self):
        return self.ok


def test_requests_go_to_the_least_busy_replica_ties_in_turn():
    a, b, c = FakeEngine("a"), FakeEngine("b"), FakeEngine("c", load=5)
    replicas = Replicas([a, b, c])
    assert replicas.speculate == 3
    assert [replicas.submit(object()) for _ in range(4)] == ["a", "b", "a", "b"]
    a.load, c.load = 3, 0
    assert {replicas.submit(object()) for _ in range(4)} == {"b", "c"}
    replicas.cancel("r1")
    assert a.cancelled == b.cancelled == c.cancelled == ["r1"]


def test_stats_add_counters_and_keep_the_worst_gap():
    a, b = FakeEngine("a", load=2), FakeEngine("b", load=1)
    b.stats = lambda: {"queue_size": 1, "batch_size": 3, "steps": 5, "host_gap_ms_median": 7}
    stats = Replicas([a, b]).stats()
    assert stats == {
        "queue_size": 3,
        "batch_size": 4,
        "steps": 15,
        "host_gap_ms_median": 7,
        "replicas": 2,
    }
    b.ok = False
    assert not Replicas([a, b]).healthy()


def test_two_replicas_of_two_devices_serve_the_same_ids(tiny_checkpoints, xla_cache, driver_greedy):
    from tgix.engine.factory import EngineOptions, create_replicas
    from tgix.engine.limits import LimitRequest
    from tgix.models import load_model
    from tgix.tokenizer import load_tokenizer

    prompts = [prompt(700 + i, 4 + 5 * i) for i in range(6)]
    expected = [driver_greedy(p, 8) for p in prompts]
    loaded = load_model(str(tiny_checkpoints("llama")), num_shard=2)
    options = EngineOptions(  # no mixed shapes: routing does not need them, each replica compiles
        compilation_cache=xla_cache, progress=False, max_top_n_tokens=3, prefix_caching=False
    )
    engine = create_replicas(
        loaded,
        load_tokenizer(loaded.files),
        LimitRequest(**LIMITS),
        options,
        data=2,
    )
    try:
        first, second = engine.engines
        assert [d.id for d in first.runner.mesh.devices.flat] == [0, 1]
        assert [d.id for d in second.runner.mesh.devices.flat] == [2, 3]
        assert second.grammar_compiler is None
        before = [e.stats()["steps"] for e in engine.engines]
        streams = [engine.submit(greedy(8, prompt_ids=p)) for p in prompts]
        assert [ids(list(s)[-1]) for s in streams] == expected
        after = [wait_idle(e)["steps"] for e in engine.engines]
        assert all(a > b for a, b in zip(after, before, strict=True))  # both served
        assert engine.stats()["used_pages"] == 0 and engine.healthy()
    finally:
        engine.shutdown()
