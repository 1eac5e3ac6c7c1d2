"""The run-time stack for unconstrained values (tgix.grammar.pushdown): nesting below the
explicit levels at byte and token level, masks against a brute-force walk of the stack
machine, EOS only once every container is closed, and the cache round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tgix.grammar.index import FINISHED
from tgix.grammar.options import GrammarOptions
from tgix.grammar.pipeline import CompiledArrays, compile_arrays
from tgix.grammar.pushdown import PushdownIndex
from tgix.grammar.spec import GrammarSpec
from tgix.grammar.token_trie import build_byte_trie
from tgix.grammar.vocabulary import TokenVocabulary

from .json_helpers import accepts_text

EOS = 1
JSON_TOKENS = [
    None, None,  # 0: special, 1: EOS
    b"{", b"}", b"[", b"]", b'"', b":", b",", b" ", b"a", b"1", b"null",
    b'{"', b'"}', b"}}", b"]]", b"]}", b"}]", b'[{"', b'":', b'":{"', b'"}}', b"[]", b"{}",
    b"[[", b", ", b'"a"', b'"a":', b"1]", b"1}", b'"}]},', b"]]]",
]  # fmt: skip
SHALLOW = GrammarOptions(any_value_depth=0)  # every container goes through the stack


def vocab(byte_complete: bool) -> TokenVocabulary:
    tokens = list(JSON_TOKENS)
    if byte_complete:  # every single byte too: the index takes its lookahead shortcut
        tokens += [bytes([b]) for b in range(256)]
    return TokenVocabulary(tuple(tokens), (EOS,), len(tokens))


def compiled(schema, v: TokenVocabulary, options: GrammarOptions = SHALLOW):
    spec = GrammarSpec.json(json.dumps(schema))
    return compile_arrays(spec, v, build_byte_trie(v.token_bytes), options)


def allowed_ids(index, state) -> set[int]:
    bits = np.unpackbits(index.mask(state).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def brute_force(index: PushdownIndex, state: int) -> set[int]:
    """Tokens after which the stack machine still has a configuration; EOS when one has an
    empty stack in an accepting state. (Any open JSON container can still be finished.)"""
    configs = index.configurations(state)
    out = {
        t for t, data in enumerate(index.vocab.token_bytes) if data and index.walk(configs, data)
    }
    if index.is_accepting(state):
        out.add(EOS)
    return out


def random_value(rng, depth: int):
    kind = rng.integers(0, 4 if depth > 0 else 2)
    if kind == 0:
        return [None, True, 1.5, -2, 'a\u00e9"}'][rng.integers(0, 5)]
    if kind == 1:
        return "s" * int(rng.integers(0, 3))
    if kind == 2:
        return [random_value(rng, depth - 1) for _ in range(rng.integers(0, 3))]
    return {f"k{i}": random_value(rng, depth - 1) for i in range(rng.integers(0, 3))}


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_values_nest_without_bound_and_malformed_text_is_rejected(depth):
    options = GrammarOptions(any_value_depth=depth)
    schemas = [{}, {"type": "object", "properties": {"a": {"type": "integer"}}}]
    rng = np.random.default_rng(depth)
    for _ in range(60):
        value = {"a": 1, "deep": random_value(rng, 7)}
        for separators in ((", ", ": "), (",", ":")):
            text = json.dumps(value, separators=separators)
            for schema in schemas:
                assert accepts_text(schema, text, options), text
            # one bracket or comma removed or doubled: accepted only if still valid JSON
            spots = [i for i, c in enumerate(text) if c in "[]{},"]
            i = spots[rng.integers(0, len(spots))]
            for bad in (text[:i] + text[i + 1 :], text[:i] + text[i] + text[i:]):
                if accepts_text({}, bad, options):
                    json.loads(bad)
    assert not accepts_text({"type": "object", "properties": {"a": {"type": "integer"}}},
                            '{"a": "x", "b": [[[1]]]}', options)  # fmt: skip


@pytest.mark.parametrize("byte_complete", [False, True])
def test_masks_match_a_brute_force_walk_of_the_stack_machine(byte_complete):
    v = vocab(byte_complete)
    index = compiled({}, v).attach(v)
    assert isinstance(index, PushdownIndex)
    rng = np.random.default_rng(0)
    checked = set()
    for _ in range(40):
        state, text = index.start, b""
        for _ in range(30):
            allowed = allowed_ids(index, state)
            if state not in checked:
                assert allowed == brute_force(index, state), (text, state)
                checked.add(state)
            choices = sorted(allowed)
            t = int(rng.choice(choices))
            if t == EOS:
                break
            text += v.token_bytes[t]
            state = index.advance(state, t)
        if state == FINISHED or index.is_accepting(state):
            json.loads(text)  # whatever the walk finished is JSON
    assert len(checked) > 20


def test_eos_only_once_every_container_is_closed():
    v = vocab(False)
    index = compiled({"type": "object", "properties": {"a": {}}}, v).attach(v)
    ids = {data: t for t, data in enumerate(v.token_bytes) if data}
    state = index.start
    for piece in (b'{"', b"a", b'":', b"[[", b"[", b'{"', b"a", b'":', b"1}"):
        assert not index.allows(state, EOS)
        state = index.advance(state, ids[piece])
    assert not index.allows(state, EOS)
    assert not index.allows(state, ids[b"}}"])  # "]" must close the array first
    state = index.advance(state, ids[b"]]]"])  # three levels closed by one token
    assert index.allows(state, ids[b"}"]) and not index.allows(state, EOS)
    state = index.advance(state, ids[b"}"])
    assert index.is_accepting(state) and allowed_ids(index, state) == {EOS}
    assert index.forced_token(state) is None


def test_compiled_arrays_round_trip_through_npz(tmp_path):
    v = vocab(True)
    arrays = compiled({"type": "object", "additionalProperties": {}}, v, GrammarOptions())
    assert arrays.nesting is not None and arrays.stats["trapped_states"] > 0
    np.savez(tmp_path / "g.npz", **arrays.arrays())
    with np.load(tmp_path / "g.npz") as z:
        loaded = CompiledArrays.from_arrays(z, arrays.stats)
    first, again = arrays.attach(v), loaded.attach(v)
    ids = {data: t for t, data in enumerate(v.token_bytes) if data}
    a = b = first.start
    for piece in (b'{"', b"a", b'":', b"[[", b"[", b"[[", b"1", b"]]]", b"]]", b"}"):
        assert allowed_ids(first, a) == allowed_ids(again, b)
        a, b = first.advance(a, ids[piece]), again.advance(b, ids[piece])
    assert first.is_accepting(a) and again.is_accepting(b)
