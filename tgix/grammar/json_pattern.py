"""JSON Schema `pattern` (an ECMA-262 regex, unanchored search) to a regex over the JSON text
of the string content.

The pattern describes the decoded string; the grammar constrains the JSON text. Every
character a pattern admits is written in its canonical JSON spelling (`json.dumps(...,
ensure_ascii=False)`: `\\"`, `\\\\`, `\\n`, ... and `\\u00XX` for other control characters), so a
pattern that admits `"`, `\\` or control characters still yields valid JSON, and the text of a
string is unique (needed when patterns are subtracted, e.g. additional property names).

Semantics (ECMA-262 without flags): `.` is any code point but line terminators, `\\d` `\\w`
ASCII, `\\s` the ECMA white-space set, `^` / `$` only at the start / end of a top-level
alternative (an alternative without `^` may be preceded by anything, one without `$` followed
by anything). Lookaround, backreferences, word boundaries, `\\p{..}` and flags raise a
`GrammarError` naming the construct. Python's `re`, which `jsonschema` uses, differs in
`\\d` / `\\w` / `\\s` (Unicode there) and `$` (also before a final newline); ECMA's reading is
the stricter one for the positive classes.
"""

from __future__ import annotations

import string

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_charsets import (
    CLASS_ESCAPES,
    CONTROL_ESCAPES,
    LINE_TERMINATORS,
    MAX_CODE_POINT,
    Ranges,
    charset_regex,
    complement,
)


class _Parser:
    """Recursive descent over ECMA-262 pattern syntax; emits interegular regex source."""

    def __init__(self, source: str):
        self.src = source
        self.pos = 0

    def fail(self, what: str) -> GrammarError:
        return GrammarError(f"JSON Schema pattern {self.src!r}: {what} is not supported")

    def peek(self, n: int = 1) -> str:
        return self.src[self.pos : self.pos + n]

    def eat(self, text: str) -> bool:
        if self.src.startswith(text, self.pos):
            self.pos += len(text)
            return True
        return False

    def top(self, unit: str) -> str:
        """The whole pattern as a full-match regex over the string content."""
        alternatives = []
        while True:
            start = self.eat("^")
            items = self.sequence()
            end = bool(items) and items[-1] == "$"
            if end:
                items.pop()
            if "$" in items or "^" in items:
                raise self.fail("an anchor inside the pattern")
            any_ = f"{unit}*"
            alternatives.append(("" if start else any_) + "".join(items) + ("" if end else any_))
            if not self.eat("|"):
                break
        if self.pos != len(self.src):
            raise GrammarError(f"JSON Schema pattern {self.src!r}: unbalanced ')'")
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

    def disjunction(self) -> str:
        options = [self.sequence()]
        while self.eat("|"):
            options.append(self.sequence())
        for items in options:
            if "^" in items or "$" in items:
                raise self.fail("an anchor inside a group")
        return "(?:" + "|".join("".join(items) for items in options) + ")"

    def sequence(self) -> list[str]:
        items: list[str] = []
        while self.pos < len(self.src) and self.peek() not in "|)":
            if self.eat("^"):
                items.append("^")
                continue
            if self.eat("$"):
                items.append("$")
                continue
            atom = self.atom()
            items.append(self.quantified(atom))
        return items

    def quantified(self, atom: str) -> str:
        bounds = None
        if self.eat("*"):
            bounds = "*"
        elif self.eat("+"):
            bounds = "+"
        elif self.eat("?"):
            bounds = "?"
        elif self.peek() == "{":
            bounds = self.braces()
        if bounds is None:
            return atom
        self.eat("?")  # lazy: same language
        if atom == "":
            return ""
        return f"(?:{atom}){bounds}"

    def braces(self) -> str | None:
        """`{n}`, `{n,}`, `{n,m}`; anything else leaves `{` a literal (ECMA Annex B)."""
        end = self.src.find("}", self.pos)
        body = self.src[self.pos + 1 : end] if end > 0 else ""
        lo, comma, hi = body.partition(",")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        if hi and int(hi) < int(lo):
            raise GrammarError(f"JSON Schema pattern {self.src!r}: bad repetition {{{body}}}")
        self.pos = end + 1
        return "{" + lo + ("," + hi if comma else "") + "}"

    def atom(self) -> str:
        ch = self.src[self.pos]
        if ch == "(":
            return self.group()
        if ch == "[":
            return self.char_class()
        if ch == ".":
            self.pos += 1
            return charset_regex(complement(LINE_TERMINATORS)) or ""
        if ch == "\\":
            self.pos += 1
            return self.atom_escape()
        if ch in "*+?":
            raise GrammarError(f"JSON Schema pattern {self.src!r}: nothing to repeat")
        if ch == "{" and self.braces_follow():
            raise GrammarError(f"JSON Schema pattern {self.src!r}: nothing to repeat")
        self.pos += 1
        return self.code_point(ord(ch))

    def braces_follow(self) -> bool:
        save = self.pos
        found = self.braces() is not None
        self.pos = save
        return found

    def group(self) -> str:
        self.pos += 1
        if self.eat("?"):
            if self.eat(":"):
                pass
            elif self.eat("<") or self.eat("P<"):
                if self.peek() in ("=", "!"):
                    raise self.fail("lookbehind")
                close = self.src.find(">", self.pos)
                if close < 0:
                    raise GrammarError(f"JSON Schema pattern {self.src!r}: bad group name")
                self.pos = close + 1
            elif self.peek() in ("=", "!"):
                raise self.fail("lookahead")
            else:
                raise self.fail(f"group syntax '(?{self.peek()}'")
        inner = self.disjunction()
        if not self.eat(")"):
            raise GrammarError(f"JSON Schema pattern {self.src!r}: missing ')'")
        return inner

    def code_point(self, cp: int) -> str:
        # a UTF-16 surrogate pair written as two escapes is one code point
        if 0xD800 <= cp <= 0xDBFF and self.peek(2) == "\\u":
            save = self.pos
            self.pos += 1
            low = self.char_escape()
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
            else:
                self.pos = save
        return charset_regex([(cp, cp)]) or ""

    def atom_escape(self) -> str:
        ch = self.peek()
        if ch in CLASS_ESCAPES or ch.lower() in CLASS_ESCAPES:
            self.pos += 1
            ranges = CLASS_ESCAPES[ch.lower()]
            return charset_regex(ranges if ch.islower() else complement(ranges)) or ""
        if ch in "bB":
            raise self.fail("a word boundary")
        if ch.isdigit() and ch != "0":
            raise self.fail("a backreference")
        if ch == "k":
            raise self.fail("a named backreference")
        cp = self.char_escape()
        if cp is None:
            raise self.fail(f"the escape \\{ch}")
        return self.code_point(cp)

    def char_escape(self) -> int | None:
        """A character escape after the backslash; None if it is not one."""
        ch = self.src[self.pos : self.pos + 1]
        if not ch:
            raise GrammarError(f"JSON Schema pattern {self.src!r}: trailing backslash")
        self.pos += 1
        if ch in CONTROL_ESCAPES:
            return CONTROL_ESCAPES[ch]
        if ch == "0" and not self.peek().isdigit():
            return 0
        if ch == "c" and self.peek().isalpha():
            self.pos += 1
            return ord(self.src[self.pos - 1]) % 32
        if ch == "x" and _is_hex(self.peek(2), 2):
            self.pos += 2
            return int(self.src[self.pos - 2 : self.pos], 16)
        if ch == "u":
            if _is_hex(self.peek(4), 4):
                self.pos += 4
                return int(self.src[self.pos - 4 : self.pos], 16)
            close = self.src.find("}", self.pos)
            if self.peek() == "{" and close > 0 and _is_hex(self.src[self.pos + 1 : close], 0):
                value = int(self.src[self.pos + 1 : close], 16)
                self.pos = close + 1
                return value if value <= MAX_CODE_POINT else None
            return None
        if ch.isalnum():
            return None  # \p, \A, \Z, ...: Unicode properties, Python-only or undefined
        return ord(ch)

    def char_class(self) -> str:
        self.pos += 1
        negate = self.eat("^")
        ranges: Ranges = []
        while not self.eat("]"):
            if self.pos >= len(self.src):
                raise GrammarError(f"JSON Schema pattern {self.src!r}: missing ']'")
            low = self.class_atom()
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):
                save = self.pos
                self.pos += 1
                high = self.class_atom()
                if isinstance(low, int) and isinstance(high, int):
                    if high < low:
                        raise GrammarError(f"JSON Schema pattern {self.src!r}: bad class range")
                    ranges.append((low, high))
                    continue
                self.pos = save  # a class escape next to '-': the '-' is literal
            ranges.extend([(low, low)] if isinstance(low, int) else low)
        ranges = complement(ranges) if negate else ranges
        return charset_regex(ranges) or "[]"

    def class_atom(self) -> int | Ranges:
        ch = self.src[self.pos]
        if ch != "\\":
            self.pos += 1
            if 0xD800 <= ord(ch) <= 0xDFFF:
                return []  # unpaired surrogates cannot occur in UTF-8 text
            return ord(ch)
        self.pos += 1
        ch = self.peek()
        if ch.lower() in CLASS_ESCAPES:
            self.pos += 1
            ranges = CLASS_ESCAPES[ch.lower()]
            return ranges if ch.islower() else complement(ranges)
        if ch == "b":
            self.pos += 1
            return 8
        if ch == "-":
            self.pos += 1
            return ord("-")
        cp = self.char_escape()
        if cp is None:
            raise self.fail(f"the escape \\{ch} in a class")
        return cp


def _is_hex(text: str, n: int) -> bool:
    """`text` is n hex digits (n == 0: one or more)."""
    return (len(text) == n or n == 0) and text != "" and all(c in string.hexdigits for c in text)


def pattern_regex(source: str, unit: str) -> str:
    """Regex over JSON string content (between the quotes) for the strings in which `source`
    finds a match. `unit` is the regex of one content character, used for the unanchored
    parts. A group around the whole pattern is dropped first, so that `(^a|^b)` reads as
    `^a|^b`."""
    return _Parser(_unwrap(source)).top(unit)


def _unwrap(source: str) -> str:
    """The inside of a plain, named or non-capturing group spanning the whole pattern."""
    while source.startswith("(") and source.endswith(")") and not source.startswith("(?="):
        if source.startswith(("(?!", "(?<=", "(?<!")):
            break
        depth, i, in_class = 0, 0, False
        while i < len(source):
            ch = source[i]
            if ch == "\\":
                i += 2
                continue
            if in_class:
                in_class = ch != "]"
            elif ch == "[":
                in_class = True
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0 and i != len(source) - 1:
                    return source  # the first group closes before the end
            i += 1
        inner = source[1:-1]
        if inner.startswith("?:"):
            inner = inner[2:]
        elif inner.startswith(("?<", "?P<")) and ">" in inner:
            inner = inner[inner.index(">") + 1 :]
        elif inner.startswith("?"):
            break
        source = inner
    return source
