"""The engine's background mask builder (host only): a row whose grammar mask is not built
within the wait budget sits steps out, keeps its pages, and rejoins once the mask is there;
failures stay with the grammar and end only that request."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.engine.fake_device import alone
from tgix.engine.mask_builder import MaskBuilder, ahead_from_env, budget_from_env


class GatedGrammar:
    """A lazy grammar whose mask builds wait on `gate` (the test decides when they end)."""

    def __init__(self, successors=None):
        self.successors = successors or {}  # state -> where its tokens lead
        self.gate = threading.Event()
        self.built: dict[int, np.ndarray] = {}
        self.builds: list[tuple[int, str]] = []  # (state, thread name)

    def has_mask(self, state: int) -> bool:
        return state in self.built

    def mask(self, state: int) -> np.ndarray:
        if state not in self.built:
            assert self.gate.wait(10)
            self.builds.append((state, threading.current_thread().name))
            self.built[state] = np.ones(1, dtype=np.uint32)
        return self.built[state]

    def forced_token(self, state: int) -> None:
        self.mask(state)

    def mask_and_successors(self, state: int) -> list[int]:  # as LazyTokenIndex's
        self.mask(state)
        return [q for q in self.successors.get(state, ()) if q not in self.built]


def test_a_mask_not_ready_in_time_is_built_on_the_thread_and_wakes_the_engine():
    woken = threading.Event()
    builder = MaskBuilder(0.0, on_ready=woken.set)
    try:
        grammar = GatedGrammar()
        assert not builder.wait(grammar, 3)  # budget 0: submitted, not waited for
        assert not builder.wait(grammar, 3)  # asked again meanwhile: still one build queued
        assert not woken.is_set()
        grammar.gate.set()
        assert woken.wait(10)
        assert builder.wait(grammar, 3)
        assert grammar.builds == [(3, "tgix-masks")]
        assert builder.wait(object(), 0)  # an eager grammar (no has_mask): always ready
    finally:
        builder.close()


def test_a_wait_within_budget_returns_the_built_mask_and_inline_builds_in_the_caller():
    builder = MaskBuilder(10.0)
    try:
        grammar = GatedGrammar()
        grammar.gate.set()
        assert builder.wait(grammar, 1)  # within the budget: no step is skipped
    finally:
        builder.close()
    inline = MaskBuilder.inline()
    grammar = GatedGrammar()
    grammar.gate.set()
    assert inline.wait(grammar, 2)
    assert grammar.builds == [(2, threading.current_thread().name)]


def test_after_a_demanded_mask_its_few_successors_are_built_ahead():
    builder = MaskBuilder(10.0, ahead=True)
    try:
        grammar = GatedGrammar(successors={1: [2, 3], 2: [4]})
        grammar.gate.set()
        assert builder.wait(grammar, 1)
        deadline = time.monotonic() + 10
        while not (grammar.has_mask(2) and grammar.has_mask(3)) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert [s for s, _ in grammar.builds] == [1, 2, 3]  # not 4: one level ahead only
    finally:
        builder.close()
    off = MaskBuilder(10.0, ahead=False)
    try:
        grammar = GatedGrammar(successors={1: [2]})
        grammar.gate.set()
        assert off.wait(grammar, 1)
        time.sleep(0.05)  # time enough for an ahead build, were one queued
        assert [s for s, _ in grammar.builds] == [1]
    finally:
        off.close()


def test_ahead_from_env(monkeypatch):
    monkeypatch.delenv("TGIX_GRAMMAR_MASK_AHEAD", raising=False)
    assert ahead_from_env(True) and not ahead_from_env(False)
    monkeypatch.setenv("TGIX_GRAMMAR_MASK_AHEAD", "1")
    assert ahead_from_env(False)
    monkeypatch.setenv("TGIX_GRAMMAR_MASK_AHEAD", "0")
    assert not ahead_from_env(True)
    monkeypatch.setenv("TGIX_GRAMMAR_MASK_AHEAD", "yes")
    with pytest.raises(ValueError):
        ahead_from_env(True)


def test_budget_from_env(monkeypatch):
    monkeypatch.delenv("TGIX_GRAMMAR_MASK_WAIT_MS", raising=False)
    assert budget_from_env() == pytest.approx(0.005)
    monkeypatch.setenv("TGIX_GRAMMAR_MASK_WAIT_MS", "0")
    assert budget_from_env() == 0
    monkeypatch.setenv("TGIX_GRAMMAR_MASK_WAIT_MS", "inline")
    assert budget_from_env() is None
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv("TGIX_GRAMMAR_MASK_WAIT_MS", bad)
        with pytest.raises(ValueError):
            budget_from_env()


@pytest.mark.parametrize("chunked", [False, True])
def test_a_held_row_sits_steps_out_keeps_its_pages_and_rejoins(make, chunked):
    dev = make(20, 4, chunked_prefill=chunked)
    grammar = GatedGrammar()
    held = dev.add("h", 5, 4, request=SimpleNamespace(grammar=grammar))
    dev.add("o", 3, 4)
    dev.step()  # both prompts
    held.waiting_for_mask = True  # what LiveRequests sets when the builder ran out of budget
    pages = list(held.pages)
    for _ in range(2):
        step = dev.sched.schedule()
        assert [r.request_id for r in step.rows] == ["o"]
        dev.step(step)
    assert held.pages == pages and held.status.value == "running"
    grammar.built[held.grammar_state] = np.ones(1, dtype=np.uint32)
    step = dev.sched.schedule()
    assert sorted(r.request_id for r in step.rows) == ["h", "o"]
    assert not held.waiting_for_mask
    dev.step(step)
    dev.run()
    assert held.output_ids == alone(5, "h", 4)


def test_a_schedule_with_only_held_rows_is_empty_until_the_mask_is_built(make):
    dev = make(20, 4)
    grammar = GatedGrammar()
    held = dev.add("h", 5, 3, request=SimpleNamespace(grammar=grammar))
    dev.step()
    held.waiting_for_mask = True
    assert dev.sched.schedule() is None
    grammar.built[0] = np.ones(1, dtype=np.uint32)
    dev.run()
    assert held.output_ids == alone(5, "h", 3)
