"""A stand-in for tgix.grammar.GrammarCompiler: records each GrammarSpec and "compiles" it to
a FakeIndex, so the HTTP layer's grammar handling is tested without the real compiler.
A spec whose text contains "BAD" fails with a GrammarError naming it; `delay` makes every
compilation take that long (to overlap requests)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tgix.grammar import GrammarError, GrammarSpec


@dataclass(frozen=True)
class FakeIndex:
    spec: GrammarSpec


class FakeCompiler:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.delay = 0.0
        self.specs: list[GrammarSpec] = []

    def compile(self, spec: GrammarSpec) -> FakeIndex:
        self.specs.append(spec)
        if "BAD" in spec.value:
            raise GrammarError(f"cannot compile {spec.kind} grammar: BAD is not allowed")
        return FakeIndex(spec)

    async def compile_async(self, spec: GrammarSpec) -> FakeIndex:
        await asyncio.sleep(self.delay)
        return self.compile(spec)
