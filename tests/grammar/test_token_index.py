"""Token index against brute force on small vocabularies built to hit the pitfalls: tokens
that span several transitions or run past the end of the language, UTF-8 characters split
across tokens, dead ends no token can leave, EOS exactly in accepting states, padding ids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tgix.grammar import regex_tree as rt
from tgix.grammar.automaton import DEAD, build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.index import FINISHED, build_index
from tgix.grammar.token_trie import build_byte_trie
from tgix.grammar.vocabulary import TokenVocabulary

EOS = 1
TOKENS = [
    None, None,  # 0: special, 1: EOS
    b"{", b"}", b'"', b":", b'":', b'"}', b"a", b"ab", b"abc", b"b", b"1", b"12", b"0",
    b" ", b"\xe2", b"\x82", b"\xac", b"\xe2\x82", "€".encode(), "é".encode(), b"\xc3",
    b"\xa9", b'"a"', b"}}", b"1,", b",",
]  # fmt: skip


def vocab(tokens=TOKENS, size=None) -> TokenVocabulary:
    size = size or len(tokens)
    return TokenVocabulary(tuple(tokens) + (None,) * (size - len(tokens)), (EOS,), size)


def index_for(regex: str, v: TokenVocabulary | None = None):
    v = v or vocab()
    return build_index(build_dfa(rt.Regex(regex)), v, build_byte_trie(v.token_bytes))


def brute_force_allowed(dfa, v: TokenVocabulary, state: int, depth: int = 6) -> set[int]:
    """Tokens whose bytes all have transitions and after which some sequence of at most
    `depth` more tokens reaches acceptance."""

    def live(s, d):
        if dfa.accepting[s]:
            return True
        if d == 0:
            return False
        return any(step(s, t) is not None and live(step(s, t), d - 1) for t in text_ids)

    def step(s, t):
        end = dfa.walk(v.token_bytes[t], s)
        return None if end == DEAD else end

    text_ids = [t for t, b in enumerate(v.token_bytes) if b]
    allowed = {t for t in text_ids if step(state, t) is not None and live(step(state, t), depth)}
    if dfa.accepting[state]:
        allowed.add(EOS)
    return allowed


def allowed_ids(index, state) -> set[int]:
    bits = np.unpackbits(index.mask(state).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


@pytest.mark.parametrize(
    "regex",
    [r'\{"a":[0-9]+\}', r"(ab|abc)+", r"[0-9]{1,2}(,[0-9])?", r"€|é+", r'"[^"]*"', r"a{2}"],
)
def test_every_reachable_state_matches_brute_force(regex):
    index = index_for(regex)
    seen, todo = {0}, [0]
    while todo:
        state = todo.pop()
        expected = brute_force_allowed(index.dfa, index.vocab, state)
        assert allowed_ids(index, state) == expected, (regex, state)
        for t in expected - {EOS}:
            nxt = index.advance(state, t)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)


def test_multibyte_character_split_across_tokens():
    index = index_for(r"€")
    for split in ([20], [16, 17, 18], [19, 18]):  # "€", e2 82 ac, "e2 82" + ac
        state = 0
        for t in split:
            assert index.allows(state, t)
            state = index.advance(state, t)
        assert index.is_accepting(state) and index.allows(state, EOS)
    assert not index.allows(0, 22)  # 0xc3 starts "é", not "€"


def test_token_running_past_the_end_is_not_allowed():
    index = index_for(r"a")
    assert index.allows(0, 8) and not index.allows(0, 9)  # "a" yes, "ab" runs past the end
    after = index.advance(0, 8)
    assert allowed_ids(index, after) == {EOS}  # accepting with no continuation: EOS forced


def test_eos_only_in_accepting_states_and_both_where_it_can_continue():
    index = index_for(r"a|ab")
    assert not index.allows(0, EOS)
    s = index.advance(0, 8)  # "a": complete, and "b" may follow
    assert allowed_ids(index, s) == {EOS, 11}
    end = index.advance(s, 11)
    assert allowed_ids(index, end) == {EOS}  # accepting with no continuation: EOS forced
    assert index.advance(end, EOS) == FINISHED and index.is_accepting(FINISHED)


def test_dead_ends_are_pruned_and_impossible_grammars_refused():
    no_ac = list(TOKENS)
    no_ac[18] = no_ac[20] = None  # nothing ends "€" any more: e2 82 leads nowhere
    v = vocab(no_ac)
    index = index_for(r"a€|b", v)
    assert allowed_ids(index, 0) == {11}  # "b" only: "a" would lead to a dead end
    with pytest.raises(GrammarError, match="vocabulary cannot produce"):
        index_for(r"€", v)


def test_padding_ids_and_special_tokens_are_never_allowed():
    index = index_for(r"[^x]*", vocab(size=70))
    assert index.width == 3
    allowed = allowed_ids(index, 0)
    assert 0 not in allowed and not any(t >= len(TOKENS) for t in allowed)


def test_forced_tokens():
    index = index_for(r'\{"a"')
    assert index.forced_token(0) == 2  # "{" is the only way on
    s = index.advance(0, 2)
    assert index.forced_token(s) is None  # '"a"' or '"' then "a"
    assert index_for(r"[0-9]").forced_token(0) is None


@pytest.mark.parametrize("tokens", [TOKENS[2:12], TOKENS[12:]])
def test_random_walks_only_produce_strings_of_the_language(tokens):
    toks = [None, None, *tokens]
    v = vocab(toks)
    dfa = build_dfa(rt.Regex(r"[a-c{}\":]{0,6}|[0-9, ]+|€|é"))
    index = build_index(dfa, v, build_byte_trie(v.token_bytes))
    rng = np.random.default_rng(0)
    for _ in range(200):
        state, out = 0, b""
        for _ in itertools.count():
            allowed = sorted(allowed_ids(index, state))
            t = int(rng.choice(allowed))
            if t == EOS:
                break
            out += v.token_bytes[t]
            state = index.advance(state, t)
        assert dfa.accepts(out), out


@pytest.mark.parametrize(
    "regex",
    [r'"[^"\\]{0,40}"', r'\{"a":(true|false|[0-9]{1,3})\}', r"(€|é|[a-c]){2,30}x", r"[0-9]+"],
)
def test_lookahead_classes_give_the_masks_of_the_token_search(regex, monkeypatch):
    """A vocabulary with every single byte takes the shortcut (masks shared by states that
    agree on every string up to the longest token); the token-level search agrees."""
    import tgix.grammar.index as index_module

    tokens = [None, None, *(bytes([b]) for b in range(256)), *TOKENS[2:]]
    tokens += [b'"' + b"x" * 9, b"abcabc", "€€".encode(), b'":tr', b"}"]
    v = vocab(tokens)
    dfa = build_dfa(rt.Regex(regex))
    trie = build_byte_trie(v.token_bytes)
    fast = build_index(dfa, v, trie)
    assert "distinct_masks" in fast.stats
    monkeypatch.setattr(index_module, "_single_bytes_finish_everywhere", lambda *a: False)
    searched = build_index(dfa, v, trie)
    assert "distinct_masks" not in searched.stats
    for state in range(dfa.num_states):
        assert (fast.mask(state) == searched.mask(state)).all(), (regex, state)
    if "40" in regex:
        assert fast.stats["distinct_masks"] < dfa.num_states
