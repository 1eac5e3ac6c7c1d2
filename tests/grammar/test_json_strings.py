"""String schemas: the JSON string grammar, lengths in code points, `pattern` (ECMA-262,
unanchored search, JSON-escaped), `format`."""

from __future__ import annotations

import json
import re

import pytest

from tests.grammar.json_helpers import accepts_text, check, notes
from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import CANONICAL_UNIT
from tgix.grammar.json_formats import format_regex
from tgix.grammar.json_pattern import pattern_regex
from tgix.grammar.json_schema import schema_to_tree

STRING = {"type": "string"}


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('"plain"', True),
        ('"\\u00e9\\u00E9"', True),
        ('"\\ud83d\\ude00"', True),  # surrogate pair
        ('"\\ud83d"', False),  # lone high surrogate
        ('"\\ude00"', False),  # lone low surrogate
        ('"\\" \\\\ \\/ \\b \\f \\n \\r \\t"', True),
        ('"\\x"', False),
        ('"\\u12"', False),
        ('"a\nb"', False),  # raw control character
        ('"a\x7fb"', True),  # DEL needs no escape
        ('"😀中é"', True),
        ('"unterminated', False),
        ('"a"b"', False),
    ],
)
def test_json_string_grammar(text, ok):
    assert accepts_text(STRING, text) is ok


def test_lengths_count_code_points():
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    check(schema, valid=["ab", "😀😀😀", "\n\t"], invalid=["a", "abcd", "😀"])
    # an escape or a surrogate pair is one character
    assert accepts_text(schema, '"\\ud83d\\ude00\\n"')
    assert accepts_text(schema, '"\\u0041\\u0042\\u0043"')
    assert not accepts_text(schema, '"\\u0041\\u0042\\u0043\\u0044"')


def test_large_max_length_is_capped_and_reported():
    schema = {"type": "string", "maxLength": 32767}
    assert any("maxLength 32767" in n for n in notes(schema))
    assert accepts_text(schema, json.dumps("x" * 200))


def test_pattern_is_an_unanchored_search():
    check({"type": "string", "pattern": "ab"}, valid=["ab", "xaby"], invalid=["a b", ""])
    check({"type": "string", "pattern": "^ab"}, valid=["ab", "abc"], invalid=["xab"])
    check({"type": "string", "pattern": "ab$"}, valid=["ab", "xab"], invalid=["abx"])
    check({"type": "string", "pattern": "^a|b$"}, valid=["ax", "xb"], invalid=["xa", "bx"])
    check({"type": "string", "pattern": ""}, valid=["", "anything"], invalid=[1])


@pytest.mark.parametrize(
    ("pattern", "valid", "invalid"),
    [
        (r"^\d{3}-\d{4}$", ["555-1234"], ["5551234", "555-12345"]),
        (r"^[A-Z][a-z]+(?: [A-Z][a-z]+)*$", ["Ada Lovelace"], ["ada", "Ada  L"]),
        (r"^\w+@\w+\.\w+$", ["a_b@c.de"], ["a@b", "a b@c.d"]),
        (r"^[^\s]+$", ["x", "é"], ["a b", "a\tb", "\u00a0"]),
        (r"^(?:[01]\d|2[0-3]):[0-5]\d$", ["23:59", "00:00"], ["24:00", "1:00"]),
        (r"^[\u4e00-\u9fa5]{2}$", ["中文"], ["中", "ab"]),
        (r"^.$", ["a", "😀"], ["\n", "ab", ""]),
        (r"^a{2,}$", ["aa", "aaaa"], ["a"]),
        (r"^x{1}y?z*$", ["x", "xyzz"], ["xx"]),
        (r"^[-a]$|^\]$", ["-", "a", "]"], ["b"]),
        (r"^\x41\u0042\/$", ["AB/"], ["AB"]),
        (r"^[\d.-]+$", ["1.2-3"], ["1,2"]),
        (r"^a\{b\}$", ["a{b}"], ["ab"]),
        (r"(^ab$|^c)", ["ab", "cd"], ["xab", "abx"]),
        (r"^[\w\_]+$", ["a_b"], ["a-b"]),
    ],
)
def test_pattern_translation(pattern, valid, invalid):
    check({"type": "string", "pattern": pattern}, valid=valid, invalid=invalid)


def test_ecma_semantics_where_python_differs():
    """ECMA: `\\d` is ASCII, named groups are `(?<name>)` (Python's `re` reads both
    differently, so jsonschema cannot be the reference here)."""
    digits = {"type": "string", "pattern": r"^\d+$"}
    assert accepts_text(digits, '"123"')
    assert not accepts_text(digits, '"٥٥٥"')
    named = {"type": "string", "pattern": "^(?<word>a+)b$"}
    assert accepts_text(named, '"aab"')
    assert not accepts_text(named, '"b"')


def test_pattern_characters_that_json_escapes():
    """A pattern admitting `"`, `\\` or control characters yields their JSON escapes."""
    schema = {"type": "string", "pattern": '^[a"\\\\\\n]+$'}
    check(schema, valid=['a"', "\\", "a\n"], invalid=["b"])
    assert accepts_text(schema, '"a\\"\\\\\\n"')
    assert not accepts_text(schema, '"a\\u0022"')  # non-canonical spelling is not generated
    any_char = {"type": "string", "pattern": "^[^x]$"}
    check(any_char, valid=['"', "\\", "\x00", "\x1f", "é"], invalid=["x", ""])


def test_pattern_and_lengths_intersect():
    schema = {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4}
    check(schema, valid=["ab", "abcd"], invalid=["a", "abcde", "AB"])
    impossible = {"type": ["string", "null"], "pattern": "^a{5}$", "maxLength": 3}
    check(impossible, valid=[None], invalid=["aaaaa"])


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        ("(?=a)b", "lookahead"),
        ("(?<=a)b", "lookbehind"),
        (r"(a)\1", "backreference"),
        (r"\bword", "word boundary"),
        (r"\p{L}", r"\\p"),
        ("a^b", "anchor"),
        ("(^a)b", "anchor"),
        ("(?i)a", "group syntax"),
        ("a)", "unbalanced"),
        ("(a", "missing"),
        ("*a", "nothing to repeat"),
    ],
)
def test_unsupported_pattern_constructs_raise(pattern, construct):
    with pytest.raises(GrammarError, match=construct):
        schema_to_tree({"type": "string", "pattern": pattern})


def test_pattern_regex_matches_python_search_on_ascii():
    """The translation agrees with Python's `re.search` (ASCII mode) on sample strings."""
    patterns = [r"^[a-f0-9]{4,8}$", r"ab+c", r"^(foo|bar)?baz$", r"[0-9]", r"^$", r"x|^y"]
    samples = ["", "abc", "abbbc", "ac", "baz", "foobaz", "barbaz", "fbaz", "7", "dead", "x", "y"]
    samples += ["deadbeef", "deadbeef0", "zy", "xx"]
    for pattern in patterns:
        translated = re.compile(pattern_regex(pattern, CANONICAL_UNIT))
        for s in samples:
            expected = re.search(pattern, s, re.ASCII) is not None
            assert bool(translated.fullmatch(json.dumps(s)[1:-1])) is expected, (pattern, s)


@pytest.mark.parametrize(
    ("name", "valid", "invalid"),
    [
        ("date", ["2024-02-29", "1999-12-31"], ["2023-02-29", "2023-04-31", "2023-1-01"]),
        ("time", ["12:00:00Z", "23:59:59.5+05:30"], ["24:00:00Z", "12:00:00"]),
        (
            "date-time",
            ["2023-01-01T12:00:00Z", "2023-01-01T00:00:00.123-08:00"],
            ["2023-01-01 12:00:00Z", "2023-01-01T12:00:00"],
        ),
        ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
        ("ipv4", ["1.2.3.4", "255.255.255.255"], ["256.1.1.1", "01.2.3.4", "1.2.3"]),
        ("ipv6", ["::1", "fe80::1", "1:2:3:4:5:6:7:8", "::ffff:1.2.3.4"], ["1::2::3", "1:2"]),
        ("email", ["a.b@example.com"], ["a@", "@b", "a b@c.d"]),
        ("hostname", ["example.com", "a-b.c"], ["-a.com", "a..b", "a_b.com"]),
        ("uri", ["https://x.org/a?b=c#d", "urn:isbn:1"], ["/relative", "http://a b"]),
        ("uri-reference", ["../a?b#c", "https://x.org"], [":x"]),
        ("duration", ["P1Y2M3DT4H5M6S", "PT1S", "P2W"], ["P", "PT", "P1S"]),
        ("json-pointer", ["", "/a~0b/c~1d"], ["a", "/a~2"]),
    ],
)
def test_formats(name, valid, invalid):
    schema = {"type": "string", "format": name}
    for value in valid:
        assert accepts_text(schema, json.dumps(value)), value
    for value in invalid:
        assert not accepts_text(schema, json.dumps(value)), value


def test_formats_agree_with_the_format_checker():
    """Whatever a format regex accepts among samples, jsonschema's checker accepts too."""
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator.FORMAT_CHECKER
    samples = ["2023-02-28", "2023-02-29", "12:00:00Z", "2023-01-01T12:00:00Z", "1.2.3.4"]
    samples += ["::1", "a@b.c", "http://x", "123e4567-e89b-12d3-a456-426614174000", "x"]
    for name in ("date", "time", "date-time", "ipv4", "ipv6", "uuid", "uri", "email"):
        regex = re.compile(format_regex(name))
        for s in samples:
            if regex.fullmatch(s):
                assert checker.conforms(s, name), (name, s)


def test_openapi_formats_and_unknown_formats():
    check({"type": "string", "format": "password"}, valid=["x"], invalid=[1])
    check({"type": "integer", "format": "int64"}, valid=[1], invalid=["1"])
    byte = {"type": "string", "format": "byte"}
    assert accepts_text(byte, '"aGk="') and accepts_text(byte, '""')
    assert not accepts_text(byte, '"a"')
    with pytest.raises(GrammarError, match="format 'colour'"):
        schema_to_tree({"type": "string", "format": "colour"})
    # a format on a non-string schema constrains nothing, known or not
    check({"type": "integer", "format": "colour"}, valid=[1], invalid=["x"])
