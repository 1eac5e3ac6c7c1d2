"""How grammar sources compile: JSON layout, schema semantics and budgets. Part of every cache
key, so two requests share a compiled grammar only when these agree."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class GrammarOptions:
    """whitespace: regex allowed between JSON tokens (after `{ [ , :` and before `} ]`), never
        outside the top-level value. `[ ]?` accepts both compact and `json.dumps` layouts and
        stops small models looping on newlines; bounded by construction.
    strict: objects without `additionalProperties` are closed (OpenAI / XGrammar behaviour);
        False keeps JSON Schema's default (extra keys allowed, after the declared ones).
    max_recursion_depth: how many times a recursive `$ref` is unrolled; deeper nesting is not
        generated (the schema compiles and the bound is reported).
    any_value_depth: container levels of an unconstrained value spelled out in the automaton
        (precomputed masks); deeper ones go through tgix.grammar.pushdown's run-time stack,
        so instances may nest to any depth.
    max_states / timeout_s: compile budget; past either the request gets a 422.
    """

    whitespace: str = r"[ ]?"
    strict: bool = False
    max_recursion_depth: int = 3
    any_value_depth: int = 2
    max_states: int = 20_000
    timeout_s: float = 10.0

    def key(self) -> str:
        return ",".join(f"{k}={v!r}" for k, v in sorted(asdict(self).items()))
