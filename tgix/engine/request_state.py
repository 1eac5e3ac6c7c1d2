"""One record per request (host only): everything the engine, the scheduler and the output
builder know of a queued or running request, kept once.

`output_ids` is the one list of generated ids (the scheduler appends sampled ids, the engine
appends a grammar's forced ids, RequestOutput reads it for the final text). `num_computed`
counts the leading tokens whose KV is in the request's pages; `num_cached` how many of those
came from the prefix cache at its last admission.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
import time
from collections.abc import Callable, Sequence

from tgix.engine.mask_builder import has_mask
from tgix.engine.output import RequestOutput
from tgix.engine.plan import HeadDrafts
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest, SamplingParams
from tgix.engine.speculate import NO_DRAFT, Draft


class Status(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(slots=True, eq=False)
class RequestState:
    """A request from admission to its terminal event.

    request_id, prompt_ids, max_new_tokens   what to run (prompt_ids: a list, hashed per page)
    request, params, output, emit            the engine's side: settings (seed filled in), the
                                             event builder, where events go (None in host tests)
    namespace          prefix-cache salt: anything besides tokens that changes KV
    image_salt         (position, digest): the prompt's images salt its pages from there on
    read_cache         False: never start past a cached prefix (prompt logprobs wanted)
    wants_prompt_logprobs  the first prompt row returns every token's logprob
    pages, num_computed, num_cached, page_digests   KV: pages in position order, tokens with
                       KV, tokens matched from the cache, the chained hash of each full page
                       registered so far
    prompt_done        its prompt's last piece ran: from now on it decodes
    draft, accepted_drafts   speculative decoding: the drafts its next row verifies, and
                       how many drafts it has kept so far
    draft_misses, draft_pause   verify steps whose drafts were all rejected (halved by one
                       that kept a draft), and how many more decode steps it sits out of
                       drafting (speculate.pause_after)
    head_drafts        a Medusa model's guesses after the token its last step sampled
    copy_point         prompt lookup's last draft: (total_len then, the all_ids() index its
                       first token came from): the text is taken to go on copying there
    """

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    request: GenerationRequest | None = None
    params: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    output: RequestOutput | None = None
    emit: Callable[[Sequence], bool] | None = None
    namespace: str = ""
    image_salt: tuple[int, str] | None = None  # (first image token's position, images' digest)
    read_cache: bool = True
    wants_prompt_logprobs: bool = False
    output_ids: list[int] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)
    page_digests: list[bytes] = dataclasses.field(default_factory=list)
    # hashes of every full page of all_ids() at that length (a waiting request is looked up
    # at each step until admitted: hashed once, not per step)
    lookup_digests: tuple[int, list[bytes]] = (-1, [])
    num_computed: int = 0
    num_cached: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    prompt_done: bool = False
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    started: float | None = None  # first scheduled
    grammar_state: int | frozenset = 0  # of request.grammar after the generated tokens
    grammar_failure: str | None = None  # a lazily built grammar ran past its budget
    waiting_for_mask: bool = False  # held out of steps until its next mask is built
    draft: Draft = NO_DRAFT  # what its row in the step being built verifies (speculate.py)
    accepted_drafts: int = 0  # drafts verified and kept (TGI's skipped tokens)
    draft_misses: int = 0
    draft_pause: int = 0
    head_drafts: HeadDrafts | None = None  # Medusa heads' last guesses (speculate.py)
    copy_point: tuple[int, int] | None = None  # (total_len, source index) of the last draft

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def mask_pending(self) -> bool:
        """True while the row is held for its grammar's next mask (engine.mask_builder);
        clears itself once the mask is there."""
        if self.waiting_for_mask and has_mask(self.request.grammar, self.grammar_state):
            self.waiting_for_mask = False
        return self.waiting_for_mask

    def token_mask(self):
        """The grammar's allowed-token words for the next token, or None. A lazily built
        grammar that cannot build this state's mask within its budget (tgix.grammar.lazy_index)
        fails this request alone: the row samples unmasked, and its commit ends it."""
        grammar = None if self.request is None else self.request.grammar
        if grammar is None or self.grammar_failure is not None:
            return None
        try:
            return grammar.mask(self.grammar_state)
        except ValueError as exc:  # GrammarError
            self.grammar_failure = str(exc)
            return None

    def advance_grammar(self, token_id: int) -> bool:
        """Move the grammar past a generated token; False if the grammar forbids it."""
        grammar = None if self.request is None else self.request.grammar
        if grammar is None:
            return True
        try:
            self.grammar_state = grammar.advance(self.grammar_state, token_id)
        except ValueError as exc:  # GrammarError: a budget, or a token the mask refused
            self.grammar_failure = self.grammar_failure or str(exc)
            return False
        return True

    def history(self) -> list[int]:
        """What the sampler needs: every id for penalties, the last one for a watermark."""
        if self.params.uses_penalties:
            return self.prompt_ids + self.output_ids
        if self.params.watermark:  # every decode step: no copy of the whole sequence
            return (self.output_ids or self.prompt_ids)[-1:]
        return []


def new_request_state(
    request_id: str,
    request: GenerationRequest,
    emit: Callable[[Sequence], bool],
    tokenizer,
    limits: EngineLimits,
    *,
    prompt_logprobs_enabled: bool,
) -> RequestState | GenerationError:
    """Check TGI's token limits, pick a seed for sampled requests, build the record."""
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
    if not n_in or n_new < 1:
        return GenerationError("need a non-empty prompt and max_new_tokens >= 1", "validation")
    params = request.sampling
    if params.is_sampling and params.seed is None:
        params = params.with_seed(secrets.randbits(64))
    wants_logprobs = prompt_logprobs_enabled and request.prompt_logprobs
    images = request.images
    state = RequestState(
        request_id,
        list(request.prompt_ids),
        n_new,
        request=request,
        params=params,
        emit=emit,
        read_cache=not wants_logprobs,  # cached positions have no logits (as in TGI, vLLM)
        image_salt=None if images is None else (int(images.positions[0]), images.digest),
        wants_prompt_logprobs=wants_logprobs,
    )
    seed = params.seed if params.is_sampling else None
    state.output = RequestOutput(request, tokenizer, state.output_ids, seed=seed)
    return state
