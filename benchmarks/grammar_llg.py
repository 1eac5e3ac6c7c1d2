"""llguidance as the third engine of `benchmarks.grammar`: its own JSON Schema converter and
Earley parser (`LLMatcher`), masks computed on demand per step.

Parent side, `tokenizer_json(hf)` serializes the HF tokenizer once (the worker builds its
`LLTokenizer` from that text, no transformers import). Worker side, `_LLGuidance` has the
engine interface of `benchmarks.grammar_engines`: compile (schema -> grammar -> matcher),
first_mask (the start state's mask), walk (mask + consume per token, then `is_accepting`).

Whitespace: llguidance's default (`whitespace_flexible`: any run of JSON whitespace between
tokens) accepts the `json.dumps` layouts the benchmark replays; it is looser than tgix's and
outlines-core's `[ ]?`, which `--llg-whitespace '[ ]?'` reproduces (`whitespace_pattern`).
Kept free of JAX imports, as `benchmarks.grammar_engines` is.
"""

from __future__ import annotations

import copy
import time

import numpy as np


def tokenizer_json(hf) -> str:
    """The fast tokenizer's own JSON (padding and truncation off), what `LLTokenizer` reads."""
    backend = copy.copy(hf.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()


class LLGuidance:
    """args: (tokenizer JSON, vocabulary size, EOS ids, whitespace pattern or None)."""

    def __init__(self, tokenizer_text: str, size: int, eos_ids: list[int], whitespace=None):
        import llguidance

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer_text, n_vocab=size, eos_token=eos_ids)
        self.defaults = {"whitespace_flexible": True}  # llguidance's own default, pinned
        if whitespace:
            self.defaults["whitespace_pattern"] = whitespace
        words = -(-self.tokenizer.vocab_size // 32)
        self.buf = np.zeros(words, dtype=np.int32)
        self.ptr, self.nbytes = self.buf.ctypes.data, self.buf.nbytes

    def compile(self, schema_text: str):
        llg = self.llg
        grammar = llg.LLMatcher.grammar_from_json_schema(schema_text, defaults=self.defaults)
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():  # the matcher never raises: a bad grammar is an error state
            raise ValueError(matcher.get_error())
        return matcher, {"warnings": len(matcher.get_grammar_warnings())}

    def first_mask(self, matcher) -> None:
        matcher.unsafe_compute_mask_ptr(self.ptr, self.nbytes)
        if matcher.is_error():
            raise ValueError(matcher.get_error())

    def walk(self, matcher, ids: list[int]) -> tuple[bool, list[int]]:
        m = matcher.deep_copy()  # the compiled start state stays pristine for the next walk
        ptr, nbytes, times, clock = self.ptr, self.nbytes, [], time.perf_counter_ns
        for t in ids:
            t0 = clock()
            m.unsafe_compute_mask_ptr(ptr, nbytes)
            if not m.consume_token(t):
                return False, times
            times.append(clock() - t0)
        return m.is_accepting(), times
