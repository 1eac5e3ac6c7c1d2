"""Constrained decoding: a grammar (regex or JSON Schema) compiled to a token-level automaton
whose per-state allowed-token bitmasks are applied on device in the sampling step.

Pipeline: source -> `regex_tree` (json_schema converts schemas) -> byte-level minimal DFA
(`automaton`, UTF-8 aware) -> `TokenIndex` over the model vocabulary (`vocabulary`, `index`)
-> cached and compiled off the engine thread by `GrammarCompiler`.
"""

from tgix.grammar.errors import GrammarError
from tgix.grammar.options import GrammarOptions

__all__ = [
    "GrammarCompiler",
    "GrammarError",
    "GrammarOptions",
    "GrammarSpec",
    "TokenIndex",
    "TokenVocabulary",
]


def __getattr__(name: str):
    if name == "GrammarCompiler":
        from tgix.grammar.compiler import GrammarCompiler

        return GrammarCompiler
    if name == "GrammarSpec":
        from tgix.grammar.spec import GrammarSpec

        return GrammarSpec
    if name == "TokenIndex":
        from tgix.grammar.index import TokenIndex

        return TokenIndex
    if name == "TokenVocabulary":
        from tgix.grammar.vocabulary import TokenVocabulary

        return TokenVocabulary
    raise AttributeError(name)
