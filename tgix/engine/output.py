"""Per-request output (host only): sampled ids -> streamed TokenEvents and the final Completion.

Each generated token is detokenized incrementally, passed through the stop-sequence buffer
(tokens that may still turn into a stop sequence are held back), and checked in TGI's order:
length (wins ties) -> EOS -> stop sequence. Top-n alternatives travel beside their token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from tgix.engine.detokenizer import IncrementalDetokenizer
from tgix.engine.plan import TokenChoice
from tgix.engine.request import Completion, GenerationRequest, TokenEvent, TokenInfo
from tgix.engine.stops import StopBuffer


class RequestOutput:
    """Builds one request's events; `tokenizer` needs decode() and `hf.all_special_ids`.
    `ids` is the request's one list of generated ids (RequestState.output_ids): whoever
    records a token appends it there before calling `add`."""

    def __init__(self, request: GenerationRequest, tokenizer, ids: list[int], *, seed: int | None):
        self.request = request
        self.tokenizer = tokenizer
        self.seed = seed
        self._special = frozenset(tokenizer.hf.all_special_ids)
        self._eos = () if request.ignore_eos else frozenset(tokenizer.eos_token_ids)
        self._detok = IncrementalDetokenizer(tokenizer, request.prompt_ids)
        self._stops = StopBuffer(request.stop)
        self._held_tops: deque[tuple[TokenInfo, ...]] = deque()
        self.ids = ids
        self.tokens: list[TokenInfo] = []  # released, in order
        self.top_tokens: list[tuple[TokenInfo, ...]] = []
        self.prefill: tuple[TokenInfo, ...] = ()
        self.prefill_top_tokens: tuple[tuple[TokenInfo, ...], ...] = ()
        self.finish_reason: str | None = None

    def _info(self, token_id: int, text: str, logprob: float | None) -> TokenInfo:
        return TokenInfo(token_id, text, logprob, token_id in self._special)

    def set_prefill(self, scores: Sequence[TokenChoice]) -> None:
        """Prompt token logprobs (decoder_input_details): scores[j] scores prompt token j+1
        (its logprob, and the top-n alternatives at its position, kept when the request asks
        for top_n_tokens)."""
        ids = self.request.prompt_ids
        texts = [self.tokenizer.decode([i]) for i in ids]
        scores = scores[: len(ids) - 1]
        lps = [None, *(float(c.logprob) for c in scores)]
        self.prefill = tuple(self._info(i, t, lp) for i, t, lp in zip(ids, texts, lps, strict=True))
        n = self.request.top_n_tokens
        if n > 0:
            tops = [tuple(self._info(i, self.tokenizer.decode([i]), lp) for i, lp in c.top[:n])
                    for c in scores]  # fmt: skip
            self.prefill_top_tokens = ((), *tops)

    def add(
        self,
        token_id: int,
        logprob: float,
        top: Sequence[tuple[int, float]] = (),
        *,
        at_length: bool = False,
    ) -> tuple[list[TokenEvent], str | None]:
        """Record a sampled token; returns the events now safe to stream and the finish
        reason if the request ends here."""
        info = self._info(token_id, self._detok.add(token_id), logprob)
        tops = tuple(self._info(i, self.tokenizer.decode([i]), lp) for i, lp in top)
        self._held_tops.append(tops)
        released = self._stops.push(info)
        reason = None
        if at_length:
            reason = "length"
        elif token_id in self._eos:
            reason = "eos_token"
        elif self._stops.matched is not None:
            reason = "stop_sequence"
        if reason is not None and self._stops.matched is None:
            released += self._stops.flush()
        self.finish_reason = reason
        return self._release(released), reason

    def draft_length(self, drafts: Sequence[int]) -> int:
        """How many of `drafts` (guessed ids after the last added one) are worth verifying:
        all, or up to the one whose text would complete a stop sequence (the request ends
        there, so what follows would be cut). One decode of the window plus the drafts, and
        a matcher pass over their text; more decodes only when a stop is found."""
        if not self._stops.stop_sequences or not drafts:
            return len(drafts)
        end = self._stops.completes_at(self._detok.peek(drafts))
        if end is None:
            return len(drafts)
        for n in range(1, len(drafts)):
            if len(self._detok.peek(drafts[:n])) >= end:
                return n
        return len(drafts)

    def _release(self, released: list[TokenInfo]) -> list[TokenEvent]:
        events = []
        for info in released:
            tops = self._held_tops.popleft()
            self.tokens.append(info)
            self.top_tokens.append(tops)
            events.append(TokenEvent(len(self.tokens), info, tops))
        return events

    def completion(
        self, *, queue_time: float, inference_time: float, skipped_tokens: int = 0
    ) -> Completion:
        if self._stops.matched is not None:  # the stop text stays, what follows it goes
            text = "".join(t.text for t in self.tokens if not t.special)
        else:
            text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        want_tops = self.request.top_n_tokens > 0
        return Completion(
            generated_text=text,
            finish_reason=self.finish_reason or "length",
            generated_tokens=len(self.ids),
            seed=self.seed,
            input_length=len(self.request.prompt_ids),
            tokens=tuple(self.tokens),
            prefill=self.prefill,
            prefill_top_tokens=self.prefill_top_tokens,
            top_tokens=tuple(self.top_tokens) if want_tops else (),
            stop_sequence=self._stops.matched,
            queue_time=queue_time,
            inference_time=inference_time,
            skipped_tokens=skipped_tokens,
        )
