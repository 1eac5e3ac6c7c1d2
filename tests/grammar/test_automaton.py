"""Regex -> byte-level DFA: the same language as Python's `re` on random strings, exactly the
valid UTF-8 encodings for negated classes and `.`, intersection and difference, budgets."""

from __future__ import annotations

import random
import re

import pytest

from tgix.grammar import regex_tree as rt
from tgix.grammar.automaton import build_dfa
from tgix.grammar.errors import GrammarError
from tgix.grammar.utf8 import byte_sequences

REGEXES = [
    r"[a-c]+x?",
    r"(ab|a)*b{2,3}",
    r"[^a-z\n]{1,3}",
    r"\d{2}-\w+",
    r"(?i)hello",
    r"a.c",
    r"(é|€|😀)+ ?",
    r"[α-ω]{2}[^α-ω]",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
]
ALPHABET = 'abcxhHeElLoO019-_. \n\t"éè€😀αβω日'


@pytest.mark.parametrize("regex", REGEXES)
def test_language_equals_python_re_on_random_strings(regex):
    dfa = build_dfa(rt.Regex(regex))
    rng = random.Random(regex)
    pattern = re.compile(regex)
    samples = ["", "abx", "ab" * 3 + "bb", "HeLLo", "12-a_", "a\nc", "é€😀 ", "αβa", "-0.5e+3"]
    samples += ["".join(rng.choices(ALPHABET, k=rng.randint(0, 6))) for _ in range(400)]
    for s in samples:
        assert dfa.accepts(s.encode()) == bool(pattern.fullmatch(s)), (regex, s)


@pytest.mark.parametrize("regex", [r"[^a]", r".", r"[^\x00-\x7f]"])
def test_negated_classes_accept_exactly_valid_utf8(regex):
    """Every byte string of length 1-2 (and lead bytes with continuations for 3-4) that the
    automaton accepts decodes as UTF-8 to one character the regex matches, and back."""
    dfa = build_dfa(rt.Regex(regex))
    pattern = re.compile(regex)
    candidates = [bytes([a]) for a in range(256)]
    candidates += [bytes([a, b]) for a in range(0xC0, 0x100) for b in range(0x70, 0xD0)]
    candidates += [bytes([a, b, 0x80]) for a in range(0xE0, 0xF0) for b in range(0x70, 0xD0)]
    candidates += [bytes([a, b, 0x80, 0xBF]) for a in range(0xF0, 0xF8) for b in (0x80, 0x90)]
    for data in candidates:
        try:
            text = data.decode("utf-8")
            expected = len(text) == 1 and bool(pattern.fullmatch(text))
        except UnicodeDecodeError:
            expected = False
        assert dfa.accepts(data) == expected, data
    surrogate = b"\xed\xa0\x80"  # U+D800 encoded: never valid UTF-8
    overlong = b"\xc0\xaf"
    assert not dfa.accepts(surrogate) and not dfa.accepts(overlong)


def test_utf8_byte_sequences_cover_each_range_exactly():
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.randrange(0x110000)
        hi = min(0x10FFFF, lo + rng.choice([0, 1, 63, 64, 2048, 70000]))
        seqs = byte_sequences(lo, hi)
        for cp in [lo, hi, max(lo - 1, 0), min(hi + 1, 0x10FFFF), rng.randint(lo, hi)]:
            if 0xD800 <= cp <= 0xDFFF:
                continue
            data = chr(cp).encode()
            hit = any(
                len(s) == len(data) and all(a <= x <= b for (a, b), x in zip(s, data, strict=True))
                for s in seqs
            )
            assert hit == (lo <= cp <= hi), (lo, hi, cp)


def test_intersection_and_difference():
    both = build_dfa(rt.Both((rt.Regex("[a-z]+"), rt.Regex(".{2,3}"))))
    assert [both.accepts(s) for s in (b"a", b"ab", b"abc", b"abcd", b"A1")] == [
        False, True, True, False, False,
    ]  # fmt: skip
    minus = build_dfa(rt.Minus(rt.Regex("[a-z]+"), rt.Regex("foo|bar")))
    assert [minus.accepts(s) for s in (b"foo", b"bar", b"fo", b"fooo", b"baz")] == [
        False, False, True, True, True,
    ]  # fmt: skip
    inside = rt.seq(rt.literal('"'), rt.Both((rt.Regex("[0-9]+"), rt.Regex(".{3}"))), rt.Regex('"'))
    dfa = build_dfa(inside)
    assert dfa.accepts(b'"123"') and not dfa.accepts(b'"12"') and not dfa.accepts(b'"abc"')


def test_minimal_and_deterministic():
    a = build_dfa(rt.Regex("(a|b)*abb"))
    b = build_dfa(rt.Regex("(a|b)*abb"))
    assert a.num_states == 4  # the textbook minimal automaton
    assert (a.table == b.table).all() and (a.accepting == b.accepting).all()
    assert build_dfa(rt.Regex("x*|x+")).num_states == 1


@pytest.mark.parametrize("regex", [r"a(?=b)", r"^a", r"a$", r"(a)\1", r"[a"])
def test_unsupported_or_invalid_regex_is_a_grammar_error(regex):
    with pytest.raises(GrammarError):
        build_dfa(rt.Regex(regex))


def test_budgets():
    with pytest.raises(GrammarError, match="too large"):
        build_dfa(rt.Regex("[a-z]{0,400}"), max_states=100)
    with pytest.raises(GrammarError, match="time budget"):
        build_dfa(rt.Regex("(a|b)*a(a|b){12}"), deadline=0.0)
