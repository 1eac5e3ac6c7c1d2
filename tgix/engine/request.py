"""What goes into the engine and what comes out of it (host only, no jax).

A caller builds a GenerationRequest (already validated and tokenized), submits it, and reads a
stream of TokenEvents ending in one Completion, or a GenerationError. Field names follow TGI's
JSON (`details.tokens[i]` is a TokenInfo, `details.prefill` a list of TokenInfo) so the server
only serialises.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """Per-request logits processing, applied on device in TGI's order: watermark ->
    repetition penalty -> frequency/presence penalty -> temperature -> top_k -> top_p ->
    typical_p -> argmax or seeded draw. Neutral values switch a stage off."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # uint64; the engine picks a random one for sampled requests
    watermark: bool = False

    @property
    def is_sampling(self) -> bool:
        """TGI's rule: any warper that changes the distribution turns sampling on."""
        return (
            self.do_sample
            or self.temperature != 1.0
            or self.top_k != 0
            or self.top_p < 1.0
            or self.typical_p < 1.0
        )

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    def with_seed(self, seed: int) -> SamplingParams:
        return dataclasses.replace(self, seed=seed)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ImageSpans:
    """A prompt's images as the decoder sees them: the embeddings that replace its image
    tokens. `positions` [N] int32 are the prompt positions of the image tokens (ascending),
    `embeds` [N, D] float32 their rows in the same order (the vision encoder's output);
    `digest` names the images' pixels (it salts the prompt's prefix-cache hashes: the same
    tokens over other images are other KV); `count` images in all. An M-RoPE model (Qwen2.5-
    VL) also has `rope_positions` [3, L] int32, each prompt token's (time, height, width)
    positions, and `rope_delta`: a later token at index i sits at i + rope_delta."""

    positions: Any  # np.ndarray [N] int32
    embeds: Any  # np.ndarray [N, D] float32
    digest: str
    count: int
    rope_positions: Any = None  # np.ndarray [3, L] int32, or None
    rope_delta: int = 0

    def span(self, start: int, end: int):
        """Indices into positions/embeds of the image tokens at prompt positions [start, end)."""
        return bisect.bisect_left(self.positions, start), bisect.bisect_left(self.positions, end)


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """A validated request: prompt token ids (already truncated) and how to continue them.

    stop            stop sequences, matched on decoded text across token boundaries
    ignore_eos      keep going past EOS (benchmarks)
    top_n_tokens    alternatives reported per generated token
    prompt_logprobs TGI's decoder_input_details: logprob of every prompt token
    best_of         sample this many sequences sharing the prompt; return the best by mean logprob
    grammar         a compiled grammar (tgix.grammar.TokenIndex): every generated token keeps
                    the output a prefix of its language, EOS only where it is complete
    images          a vision-language prompt's image embeddings (ImageSpans), or None
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_n_tokens: int = 0
    prompt_logprobs: bool = False
    best_of: int = 1
    grammar: Any = None  # tgix.grammar.TokenIndex (typed loosely: no import cycle)
    request_id: str | None = None  # None: the engine assigns one
    images: ImageSpans | None = None


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """TGI's Token: `text` is the incremental decode with special tokens kept ("" while a
    UTF-8 character is incomplete); `logprob` is None only for the first prompt token."""

    id: int
    text: str
    logprob: float | None
    special: bool


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token as streamed; `index` starts at 1 and counts events."""

    index: int
    token: TokenInfo
    top_tokens: tuple[TokenInfo, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """The terminal event of a successful request (TGI's `details` plus the text).

    generated_text is decoded with special tokens skipped and keeps a matched stop sequence
    (as TGI does); `stop_sequence` says which one matched, so OpenAI routes can cut it off.
    Times are seconds. `generated_tokens` counts every token, drafts that were accepted too.
    """

    generated_text: str
    finish_reason: str  # "length" | "eos_token" | "stop_sequence"
    generated_tokens: int
    seed: int | None
    input_length: int
    tokens: tuple[TokenInfo, ...]
    prefill: tuple[TokenInfo, ...] = ()
    prefill_top_tokens: tuple[tuple[TokenInfo, ...], ...] = ()  # with prefill and top_n_tokens
    top_tokens: tuple[tuple[TokenInfo, ...], ...] = ()
    best_of_sequences: tuple[Completion, ...] = ()
    stop_sequence: str | None = None
    queue_time: float = 0.0
    inference_time: float = 0.0
    skipped_tokens: int = 0  # speculative drafts accepted (TGI's tgi_request_skipped_tokens)


class GenerationError(Exception):
    """A request ended without a Completion. `error_type` is TGI's: "generation" (a failed
    step, non-finite logits), "validation" (the engine refused it), "overloaded",
    "shutdown"."""

    def __init__(self, message: str, error_type: str = "generation"):
        super().__init__(message)
        self.message = message
        self.error_type = error_type


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """The effective token limits after start-up sizing (what `/info` reports)."""

    max_input_tokens: int
    max_total_tokens: int
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int
    max_batch_size: int | None
    max_waiting_tokens: int
    waiting_served_ratio: float
    page_size: int
    chunked_prefill: bool
