"""Lazily built grammars (tgix.grammar.lazy_dfa, lazy_index) against the eager pipeline, on
the default model's 49k byte-level vocabulary: the same token masks at every step of every
MaskBench instance of a sample (both directions: valid and invalid instances), the same
bytes accepted on property-generated strings for each regex construct, the run-time stack,
and budgets that fail the state being built, not the grammar's earlier states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.grammar_instances import candidates
from tgix.grammar import GrammarError, GrammarOptions, GrammarSpec
from tgix.grammar import regex_tree as rt
from tgix.grammar.json_common import atomic
from tgix.grammar.lazy_index import LazyTokenIndex
from tgix.grammar.lazy_inline import inlined_atomics
from tgix.grammar.pipeline import compile_arrays, compile_lazy
from tgix.grammar.pushdown import PushdownIndex
from tgix.grammar.token_trie import build_byte_trie
from tgix.grammar.vocabulary import TokenVocabulary

MASKBENCH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "maskbench"
OPTIONS = GrammarOptions(timeout_s=30)


@pytest.fixture(scope="module")
def real():
    from tgix.models.hub import resolve_model
    from tgix.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model(None))
    vocab = TokenVocabulary.from_tokenizer(tok.hf, eos_ids=tok.eos_token_ids)
    return tok.hf, vocab, build_byte_trie(vocab.token_bytes)


def both(real, spec: GrammarSpec, options: GrammarOptions = OPTIONS):
    _, vocab, trie = real
    return compile_lazy(spec, vocab, trie, options), compile_arrays(
        spec, vocab, trie, options
    ).attach(vocab)


def replay_same(lazy, eager, ids: list[int]) -> bool:
    """Walk both along `ids` asserting equal masks; True when both accept the whole."""
    a, b = lazy.start, eager.start
    for t in ids:
        assert np.array_equal(lazy.mask(a), eager.mask(b))
        if not eager.allows(b, t):
            assert not lazy.allows(a, t)
            return False
        a, b = lazy.advance(a, t), eager.advance(b, t)
    eos = next(iter(eager.eos_ids))
    assert lazy.allows(a, eos) == eager.allows(b, eos)
    return eager.allows(b, eos)


def sample(count: int, max_bytes: int = 3000) -> list[Path]:
    """Every k-th small MaskBench file (small: their eager compiles take well under 1 s)."""
    files = sorted(p for p in MASKBENCH.glob("*.json") if p.stat().st_size <= max_bytes)
    return files[:: max(1, len(files) // count)][:count]


@pytest.mark.skipif(not MASKBENCH.exists(), reason="../shared/data/maskbench not beside the repo")
def test_masks_equal_the_eager_index_along_every_instance_of_a_maskbench_sample(real):
    hf = real[0]
    compiled = checked = 0
    for path in sample(24):
        case = json.loads(path.read_text())
        spec = GrammarSpec.json(json.dumps(case["schema"]))
        try:
            eager = compile_arrays(spec, real[1], real[2], OPTIONS).attach(real[1])
        except GrammarError:
            continue  # lazy may compile more than eager; never less (below)
        lazy = compile_lazy(spec, real[1], real[2], OPTIONS)
        compiled += 1
        for test in case.get("tests") or ():
            texts = candidates(test["data"], case["schema"])
            results = [
                replay_same(lazy, eager, hf.encode(t, add_special_tokens=False)) for t in texts
            ]
            checked += 1
            if not test["valid"]:
                assert not any(results), (path.name, test["data"])
    assert compiled >= 15 and checked >= 40


REGEXES = [
    r"[a-z]{2,5}",
    r"(ab|cd)*e",
    r"-?\d+(\.\d+)?([eE][+-]?\d+)?",
    r'"([^"\\]|\\["\\/bfnrt])*"',
    r"[α-ω]{1,3}[😀-😂]?",
    r"(x|xy)(z|yz)?",
    r"(?i:ok|no)",
    r"[0-9a-f]{8}-[0-9a-f]{4}",
]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_constructs_accept_the_same_bytes_and_tokens(real, pattern):
    lazy, eager = both(real, GrammarSpec.regex(pattern))
    hf = real[0]

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.from_regex(pattern, fullmatch=True), st.text(max_size=12)))
    def check(text: str) -> None:
        data = text.encode()
        end = lazy.dfa.walk(data)
        assert (end >= 0 and bool(lazy.dfa.accepting[end])) == eager.dfa.accepts(data)
        replay_same(lazy, eager, hf.encode(text, add_special_tokens=False))

    check()


def test_the_run_time_stack_gives_the_eager_masks(real):
    options = GrammarOptions(any_value_depth=0, timeout_s=30)
    lazy, eager = both(real, GrammarSpec.json({"type": "object"}), options)
    assert isinstance(lazy, PushdownIndex) and isinstance(eager, PushdownIndex)
    text = '{"a": [[{"b": [1, {"c": "]}"}]}], []], "d": {}}'
    assert replay_same(lazy, eager, real[0].encode(text, add_special_tokens=False))
    assert not replay_same(lazy, eager, real[0].encode('{"a": [}', add_special_tokens=False))


def test_the_start_is_usable_before_the_rest_is_built(real):
    """Only what the start mask's walk reached is built; a budget past it fails the next
    new state with a GrammarError and leaves the built states usable."""
    _, vocab, trie = real
    keys = {f"k{i}": {"type": "string"} for i in range(40)}
    schema = {"type": "object", "properties": keys, "additionalProperties": False}
    lazy = compile_lazy(GrammarSpec.json(schema), vocab, trie, OPTIONS)
    assert isinstance(lazy, LazyTokenIndex) and lazy.stats["lazy"]
    built = lazy.num_states
    assert built < 200  # the eager automaton of 40 optional keys has thousands of states
    start_mask = lazy.mask(lazy.start).copy()
    lazy.budget_s = -1.0
    brace = real[0].encode("{", add_special_tokens=False)[0]
    after = lazy.advance(lazy.start, brace)
    assert lazy.has_mask(lazy.start) and not lazy.has_mask(after)
    with pytest.raises(GrammarError, match="time budget"):
        lazy.mask(after)
    assert np.array_equal(lazy.mask(lazy.start), start_mask)
    # the failure is kept: asking again (the engine thread after the mask builder's thread)
    # raises it at once, even with time to spare now, and builds nothing more
    lazy.budget_s, builds = 30.0, len(lazy.mask_seconds)
    assert lazy.has_mask(after)
    with pytest.raises(GrammarError, match="time budget"):
        lazy.mask(after)
    assert len(lazy.mask_seconds) == builds


def test_a_state_budget_is_shared_by_every_state_of_the_grammar(real):
    _, vocab, trie = real
    small = GrammarOptions(max_states=20, timeout_s=30)  # lazily: 4 x 20 states
    with pytest.raises(GrammarError, match="too large"):
        lazy = compile_lazy(GrammarSpec.regex("[a-z]{0,100}"), vocab, trie, small)
        state = lazy.start
        for t in real[0].encode("abcdefghij" * 10, add_special_tokens=False):
            state = lazy.advance(state, t)
            lazy.mask(state)


@pytest.mark.parametrize("nested", [False, True])
def test_masks_built_on_a_thread_while_another_advances_equal_the_eager_ones(real, nested):
    """The engine's mask builder (engine.mask_builder) builds states' masks on its thread
    while the engine thread advances other rows on the same grammar: each thread replays
    its own texts on one lazy grammar, with a builder thread asked for every state first."""
    import threading

    from tgix.engine.mask_builder import MaskBuilder

    hf = real[0]
    if nested:
        options = GrammarOptions(any_value_depth=0, timeout_s=30)
        spec = GrammarSpec.json({"type": "object"})
        texts = ['{"a": [[{"b": [1, {"c": "]}"}]}], []]}', '{"d": {"e": [true, null]}}']
    else:
        options = OPTIONS
        spec = GrammarSpec.json(SCHEMA_FOR_THREADS)
        texts = ['{"name": "Ada", "age": 36, "tags": ["x"]}', '{"name": "Bo", "age": 7}']
    lazy, eager = both(real, spec, options)
    builder = MaskBuilder(0.0)
    errors: list[BaseException] = []

    def replay(text: str) -> None:
        try:
            a, b = lazy.start, eager.start
            for t in hf.encode(text, add_special_tokens=False):
                builder.wait(lazy, a)  # queued on the builder's thread, not waited for
                assert np.array_equal(lazy.mask(a), eager.mask(b))
                a, b = lazy.advance(a, t), eager.advance(b, t)
            assert lazy.is_accepting(a) and eager.is_accepting(b)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=replay, args=(t,)) for t in texts * 2]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        builder.close()
    assert not errors, errors


SCHEMA_FOR_THREADS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age"],
}


def test_a_new_states_successors_are_where_its_allowed_tokens_lead(real):
    """What the engine's mask builder builds ahead: the states without a mask yet that the
    state's allowed tokens end in (none when this call did not build the mask)."""
    hf, vocab, trie = real
    lazy = compile_lazy(GrammarSpec.regex(r"x(ab|cd|[0-9]{2})!"), vocab, trie, OPTIONS)
    assert lazy.mask_and_successors(lazy.start) == []  # built by the compile
    state = lazy.advance(lazy.start, hf.encode("x", add_special_tokens=False)[0])
    ahead = lazy.mask_and_successors(state)
    bits = np.unpackbits(lazy.mask(state).view(np.uint8), bitorder="little")
    allowed = [t for t in np.flatnonzero(bits).tolist() if t not in lazy.eos_ids]
    ends = {lazy.advance(state, t) for t in allowed}
    assert ahead and set(ahead) == {q for q in ends if q != state and not lazy.has_mask(q)}
    assert lazy.mask_and_successors(state) == []  # built already: nothing new to offer


def test_an_object_built_once_is_inlined_and_a_repeated_one_called():
    """lazy_inline: one path from the machine's root inlines an `atomic` node; a list's
    `x (, x)*` or `x+` builds x twice and calls it; a counted repeat builds its body once."""
    x = atomic(rt.Seq((rt.Regex("a"), rt.Regex("b"))))
    y = atomic(rt.Alt((rt.Regex("c"), rt.Regex("d"))))
    assert isinstance(x, rt.Both) and isinstance(y, rt.Both)
    assert inlined_atomics(rt.Seq((x, rt.Repeat(y, 0, None)))) == {id(x), id(y)}
    assert inlined_atomics(rt.Seq((x, rt.Repeat(rt.Seq((rt.Regex(","), x)), 0, None)))) == set()
    assert inlined_atomics(rt.Repeat(x, 1, None)) == set()
    assert inlined_atomics(rt.Repeat(x, 0, 5)) == {id(x)}  # one body, counted
    outer = atomic(rt.Seq((rt.Regex("{"), x, x)))
    assert inlined_atomics(outer) == {id(outer)}  # x twice: called, and nothing under it


def test_nested_objects_cost_their_states_once_not_once_per_level(real, monkeypatch):
    """Each nesting level used to hold a mirror of its callee's states: a 4-deep object of
    long strings needs well under half the states once the objects are inlined, and its
    masks are the eager ones."""
    import tgix.grammar.lazy_dfa as lazy_dfa

    tokenizer, vocab, trie = real
    schema: dict = {"type": "string", "maxLength": 80}
    value: object = "x" * 30
    for depth in range(4):
        props = {f"s{depth}": {"type": "string", "maxLength": 60}, "inner": schema}
        schema = {"type": "object", "properties": props, "required": list(props)}
        value = {f"s{depth}": "word " * 8, "inner": value}
    spec = GrammarSpec.json(schema)
    ids = tokenizer.encode(json.dumps(value), add_special_tokens=False)

    def states_used() -> int:
        lazy, eager = both(real, spec)
        assert replay_same(lazy, eager, ids)
        return lazy.dfa.shared.states

    inlined = states_used()
    monkeypatch.setattr(lazy_dfa, "inlined_atomics", lambda node: set())
    called = states_used()
    assert inlined < 0.5 * called
