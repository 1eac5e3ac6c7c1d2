"""Engine-thread bookkeeping (host only): a live request, a step in flight, admission checks,
and the rules for running a decode step ahead of reading the previous one back."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from tgix.engine.output import RequestOutput
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest, SamplingParams
from tgix.engine.scheduler import ScheduledStep, Scheduler, SequenceState

PLACEHOLDER = -1  # a sampled id not read back yet (overlapped steps)


@dataclasses.dataclass(eq=False)
class LiveRequest:
    """A queued or running request: its settings (seed filled in), output builder, scheduler
    state, and where its events go."""

    request: GenerationRequest
    params: SamplingParams
    output: RequestOutput
    seq: SequenceState
    emit: Callable[[Sequence], bool]
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    started: float | None = None  # first scheduled
    grammar_state: int | frozenset = 0  # of request.grammar after the generated tokens

    def token_mask(self):
        """The grammar's allowed-token words for the next token, or None."""
        grammar = self.request.grammar
        return None if grammar is None else grammar.mask(self.grammar_state)

    def advance_grammar(self, token_id: int) -> bool:
        """Move the grammar past a generated token; False if the grammar forbids it."""
        grammar = self.request.grammar
        if grammar is None:
            return True
        try:
            self.grammar_state = grammar.advance(self.grammar_state, token_id)
        except ValueError:  # GrammarError: the masked sampler should make this impossible
            return False
        return True

    def history(self) -> list[int]:
        """What the sampler needs: every id for penalties, the last one for a watermark."""
        if self.params.uses_penalties:
            return self.seq.prompt_ids + self.seq.output_ids
        if self.params.watermark:  # every decode step: no copy of the whole sequence
            return (self.seq.output_ids or self.seq.prompt_ids)[-1:]
        return []


@dataclasses.dataclass(eq=False)
class InFlight:
    """A dispatched step: its rows as sent, their requests (None: ended), device results."""

    step: ScheduledStep
    rows: tuple
    lives: list
    handle: object  # runner.StepOutput of device arrays
    want_prefill: bool
    started: float
    speculated: bool = False  # on_step_done already ran with placeholder ids


def admit(
    request_id: str,
    request: GenerationRequest,
    emit: Callable[[Sequence], bool],
    scheduler: Scheduler,
    tokenizer,
    limits: EngineLimits,
) -> LiveRequest | GenerationError:
    """Check TGI's token limits, pick a seed for sampled requests, queue it."""
    n_in, n_new = len(request.prompt_ids), request.max_new_tokens
    if n_in > limits.max_input_tokens:
        why = f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {n_in}"
        return GenerationError(why, "validation")
    if n_in + n_new > limits.max_total_tokens:
        why = (
            f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
            f"Given: {n_in} `inputs` tokens and {n_new} `max_new_tokens`"
        )
        return GenerationError(why, "validation")
    params = request.sampling
    if params.is_sampling and params.seed is None:
        params = params.with_seed(secrets.randbits(64))
    try:
        seq = scheduler.add(request_id, list(request.prompt_ids), n_new)
    except ValueError as exc:
        return GenerationError(str(exc), "validation")
    if seq.finish_reason == "error":
        why = "request does not fit the KV cache or the prefill budget"
        return GenerationError(why, "validation")
    seed = params.seed if params.is_sampling else None
    return LiveRequest(request, params, RequestOutput(request, tokenizer, seed=seed), seq, emit)


def can_run_ahead(rows: Sequence, lives: Sequence[LiveRequest | None]) -> bool:
    """A decode step whose next tokens need not be read first: every row decodes one token,
    none needs its history on the host (penalties, watermark) or its grammar state (the next
    mask depends on the token), none ends by length now."""
    for row, live in zip(rows, lives, strict=True):
        if live is None or row.is_prefill or len(row.token_ids) != 1:
            return False
        if live.params.uses_penalties or live.params.watermark or live.request.grammar:
            return False
        if len(live.seq.output_ids) + 1 >= live.seq.max_new_tokens:
            return False
    return True


def with_real_tokens(rows: Sequence, live: Mapping[str, LiveRequest]) -> list:
    """Rows scheduled while their last token was a placeholder, with the sampled ids."""
    patched = []
    for row in rows:
        request = live.get(row.request_id)
        if request is None or PLACEHOLDER not in row.token_ids:
            patched.append(row)
            continue
        full = request.seq.prompt_ids + request.seq.output_ids
        ids = full[row.start_pos : row.start_pos + len(row.token_ids)]
        patched.append(dataclasses.replace(row, token_ids=tuple(max(t, 0) for t in ids)))
    return patched
