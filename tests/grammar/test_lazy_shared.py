"""What lazily built grammars share across grammars (tgix.grammar.lazy_shared) and the leaf
templates every NFA is pasted from (tgix.grammar.nfa): the same automaton object for a node
that a second grammar uses, never for a schema's own objects, the same masks as the eager
index whoever builds a shared row first (threads included), literal leaves as byte chains."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from tgix.grammar import GrammarError, GrammarSpec
from tgix.grammar import regex_tree as rt
from tgix.grammar.automaton import DEAD
from tgix.grammar.json_any import any_value_tree
from tgix.grammar.json_common import Context
from tgix.grammar.lazy_dfa import LazyDFA
from tgix.grammar.lazy_shared import COMMON, CommonMachines
from tgix.grammar.nfa import _literal_bytes, leaf_template
from tgix.grammar.pipeline import compile_arrays, compile_lazy

from .test_lazy import MASKBENCH, OPTIONS, real  # noqa: F401  (the module fixture)


def _schema(key: str, nested: str) -> GrammarSpec:
    """An object with an unconstrained member (`{}`: the any-value automaton every such
    schema repeats) and a member object of its own."""
    own = {"type": "object", "properties": {nested: {"type": "integer"}}, "required": [nested]}
    props = {key: {}, "inner": own}
    return GrammarSpec.json(json.dumps({"type": "object", "properties": props}))


def _machines(index):
    dfa = getattr(index, "dfa", None) or index.base.dfa
    return dfa.shared.machines


def _any_value_machine(index):
    """The called automaton of the unconstrained value."""
    node = any_value_tree(Context(OPTIONS), False)
    found, machine = _machines(index).find(node)
    assert found
    return machine


def test_a_node_is_shared_from_the_second_grammar_that_uses_it(real):  # noqa: F811
    _, vocab, trie = real
    COMMON.clear()
    first = compile_lazy(_schema("a", "x"), vocab, trie, OPTIONS)
    assert not COMMON._machines  # seen once: built for that grammar alone
    second = compile_lazy(_schema("b", "y"), vocab, trie, OPTIONS)
    third = compile_lazy(_schema("c", "z"), vocab, trie, OPTIONS)
    assert _any_value_machine(second) is _any_value_machine(third)
    assert _any_value_machine(first) is not _any_value_machine(second)
    assert rt.digest(any_value_tree(Context(OPTIONS), False).parts[0]) in COMMON.names()
    shared = {id(m) for _, m in COMMON._machines.values()}
    kept = [{id(m) for m in _machines(i).values()} for i in (first, second, third)]
    for i, own in enumerate(kept):  # each schema's own objects stay with its grammar
        own = own - set().union(*(k for j, k in enumerate(kept) if j != i))
        assert own and not own & shared


def test_shared_rows_give_the_eager_masks_whichever_grammar_or_thread_builds_them(real):  # noqa: F811
    _, vocab, trie = real
    texts = [
        '{"k0": {"deep": [1, {"x": null}], "s": "t"}, "inner": {"v": 3}}',
        '{"k1": [true, "a\\u00e9", -2.5e3, {}], "inner": {"v": 0}}',
    ]
    specs = [_schema(f"k{i}", "v") for i in range(2)]
    eager = [compile_arrays(s, vocab, trie, OPTIONS).attach(vocab) for s in specs]
    for round_ in range(3):
        COMMON.clear()
        for s in specs:  # each node seen once, so the next grammars share it
            compile_lazy(s, vocab, trie, OPTIONS)
        lazy = [compile_lazy(s, vocab, trie, OPTIONS) for s in specs]
        failures: list = []

        def walk(i: int, lazy=lazy, failures=failures) -> None:
            try:
                ids = vocab_ids(real, texts[i])
                a, b = lazy[i].start, eager[i].start
                for t in ids:
                    assert np.array_equal(lazy[i].mask(a), eager[i].mask(b))
                    a, b = lazy[i].advance(a, t), eager[i].advance(b, t)
                assert lazy[i].is_accepting(a) and eager[i].is_accepting(b)
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=walk, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, (round_, failures)


def vocab_ids(real, text: str) -> list[int]:  # noqa: F811
    return real[0].encode(text, add_special_tokens=False)


def test_the_common_cache_keys_on_budget_and_drops_the_least_recent():
    built: list = []
    cache = CommonMachines(capacity=2)

    def get(node, max_states=10):
        found, machine = cache.lookup(node, None, max_states)
        if found:
            return machine
        if not machine:  # seen for the first time: the caller's own
            return ("own", node)
        built.append(node)
        return cache.store(node, None, max_states, node)

    assert get(rt.Regex("a")) == ("own", rt.Regex("a"))
    assert get(rt.Regex("a")) == rt.Regex("a") and built == [rt.Regex("a")]
    assert get(rt.Regex("a")) == rt.Regex("a") and built == [rt.Regex("a")]  # a hit
    assert get(rt.Regex("a"), max_states=99) == ("own", rt.Regex("a"))  # another budget
    for leaf in ("b", "c"):
        get(rt.Regex(leaf))
        get(rt.Regex(leaf))
    assert len(cache._machines) == 2 and rt.digest(rt.Regex("a")) not in cache.names()


@pytest.mark.parametrize(
    "text", ['"name"', "a.b*c+?", "{[(|)]}", "\\/-^$", "tab\there\x7f", "héllo ✓ 𝄞", ""]
)
def test_literal_leaves_are_their_bytes(text):
    source = rt.escape(text)
    assert _literal_bytes(source) == text.encode()
    dfa = LazyDFA(rt.Regex(source), 1000, float("inf"))
    end = dfa.walk(text.encode())
    assert dfa.accepting[end]
    for other in (text.encode() + b"x", b"x" + text.encode(), text.encode()[:-1]):
        if other != text.encode():
            end = dfa.walk(other)
            assert end == DEAD or not dfa.accepting[end]


@pytest.mark.parametrize("source", ["a.b", r"\d", "[x]", "(?i)a", "a|b", "a*", r"\n", "(ab)"])
def test_regex_leaves_are_not_taken_for_literals(source):
    assert _literal_bytes(source) is None


def test_a_template_too_large_to_copy_is_built_in_place():
    assert leaf_template("[0-9a-f]{300}") is None
    dfa = LazyDFA(rt.Regex("[0-9a-f]{300}"), 10_000, float("inf"))
    full, short = dfa.walk(b"a" * 300), dfa.walk(b"a" * 299)  # (walks grow `accepting`)
    assert dfa.accepting[full] and not dfa.accepting[short]


@pytest.mark.skipif(not MASKBENCH.exists(), reason="../shared/data/maskbench not beside the repo")
def test_mutually_recursive_refs_stop_at_the_time_budget_in_a_lazy_compile(real):  # noqa: F811
    """wp_8's $refs recompile at every unrolled depth (minutes); a lazy compile runs in a
    thread, where no SIGALRM can stop it, so the conversion checks the budget itself."""
    _, vocab, trie = real
    schema = json.loads((MASKBENCH / "WashingtonPost---wp_8_Normalized.json").read_text())
    options = dataclasses.replace(OPTIONS, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(GrammarError, match="time budget"):
        compile_lazy(GrammarSpec.json(json.dumps(schema["schema"])), vocab, trie, options)
    assert time.monotonic() - started < 5
