"""TGI's generate request body (GenerateRequest / CompatGenerateRequest) as Python values.

`GenerateParams` mirrors TGI's `GenerateParameters` field for field; the OpenAI routes build
one too, so a single validator serves every route. Quirk kept (§2.3): when the whole
`parameters` object is absent the defaults sample (`do_sample` true); when it is present but
silent about `do_sample`, decoding is greedy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from server.fields import Fields
from server.grammar import parse_grammar


@dataclass(slots=True, kw_only=True)
class GenerateParams:
    """TGI's GenerateParameters (§3.1); None means "not given"."""

    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None  # OpenAI routes only (TGI has no such field)
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    return_full_text: bool | None = None
    stop: list[str] = field(default_factory=list)
    truncate: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: dict[str, Any] | None = None  # normal form (server.grammar)
    adapter_id: str | None = None
    ignore_eos: bool = False  # OpenAI routes only: vLLM's extension (fixed-length benchmarks)

    def for_choice(self, j: int) -> GenerateParams:
        """Choice j of an OpenAI request's `n`: a seeded request's choices use seeds seed,
        seed + 1, ... so they differ while the request stays reproducible."""
        if j == 0 or self.seed is None:
            return self
        return dataclasses.replace(self, seed=(self.seed + j) % 2**64, stop=list(self.stop))


@dataclass(slots=True, kw_only=True)
class GenerateBody:
    inputs: str
    params: GenerateParams
    stream: bool = False


def parse_parameters(value: Any, path: str = "parameters") -> GenerateParams:
    f = Fields(value, "GenerateParameters", path)
    return GenerateParams(
        best_of=f.optional("best_of", "usize"),
        temperature=f.optional("temperature", "f32"),
        repetition_penalty=f.optional("repetition_penalty", "f32"),
        frequency_penalty=f.optional("frequency_penalty", "f32"),
        top_k=f.optional("top_k", "i32"),
        top_p=f.optional("top_p", "f32"),
        typical_p=f.optional("typical_p", "f32"),
        do_sample=f.flag("do_sample"),
        max_new_tokens=f.optional("max_new_tokens", "u32"),
        return_full_text=f.optional("return_full_text", "bool"),
        stop=f.optional("stop", "list[str]", []),
        truncate=f.optional("truncate", "usize"),
        watermark=f.flag("watermark"),
        details=f.flag("details"),
        decoder_input_details=f.flag("decoder_input_details"),
        seed=f.optional("seed", "u64"),
        top_n_tokens=f.optional("top_n_tokens", "u32"),
        grammar=parse_grammar(f, "grammar"),
        adapter_id=f.optional("adapter_id", "str"),
    )


def parse_generate(value: Any, *, compat: bool = False) -> GenerateBody:
    """Body of /generate, /generate_stream, /tokenize (and `/` with `stream` when compat)."""
    f = Fields(value, "CompatGenerateRequest" if compat else "GenerateRequest")
    inputs = f.required("inputs", "str")
    if f.value.get("parameters") is None:
        params = GenerateParams(do_sample=True)  # TGI's default_parameters()
    else:
        params = parse_parameters(f.value["parameters"])
    stream = f.flag("stream") if compat else False
    return GenerateBody(inputs=inputs, params=params, stream=stream)
