"""The engine thread's live requests (host only), from admission to their end.

LiveRequests maps request id -> RequestState for every request the scheduler holds. `take`
handles one inbox entry: a submission becomes its record (`new_request_state`: TGI's token
limits, seeds) and joins the scheduler, or n records queued together for best_of (the later
ones hit the first's pages); a cancel ends the request and its best_of siblings.
`commit_step` records a read-back step in the scheduler (or fills the placeholders of its
early commit, runahead.py) and sends each accepted token through the request's grammar and
RequestOutput (commit.py) to its stream, with the Completion once it ends. `finish` ends a
request: the scheduler releases its pages, an error goes to its stream. Only the engine
thread calls it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from tgix.engine.best_of import BestOfGroup
from tgix.engine.commit import commit_token
from tgix.engine.mask_builder import MaskBuilder
from tgix.engine.plan import StepResult
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest
from tgix.engine.request_state import RequestState, new_request_state
from tgix.engine.runahead import InFlight, fill_placeholders
from tgix.engine.scheduler import Scheduler
from tgix.engine.stream import RequestStream

NO_ROOM = "request does not fit the KV cache or the prefill budget"


class LiveRequests(Mapping[str, RequestState]):
    """Request id -> RequestState of every admitted request not yet ended. `fast_forward`:
    a grammar's forced tokens are appended at once (they join the row's next step);
    `fast_forwarded` counts them."""

    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer,
        limits: EngineLimits,
        *,
        prompt_logprobs: bool,
        fast_forward: bool,
        masks: MaskBuilder | None = None,
    ):
        self.scheduler = scheduler
        self._tokenizer, self._limits = tokenizer, limits
        self._prompt_logprobs = prompt_logprobs
        self._fast_forward = fast_forward
        self.masks = masks or MaskBuilder.inline()
        self._states: dict[str, RequestState] = {}
        self.fast_forwarded = 0

    # -- Mapping (the dict's own lookups: the engine calls these per row, every step) -------------

    def __getitem__(self, request_id: str) -> RequestState:
        return self._states[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._states

    def get(self, request_id: str, default=None):
        return self._states.get(request_id, default)

    # -- admission -------------------------------------------------------------------------------

    def take(
        self,
        kind: str,
        request_id: str,
        request: GenerationRequest | None,
        stream: RequestStream | None,
    ) -> None:
        """One inbox entry: ("submit", id, request, stream) or ("cancel", id, None, None)."""
        if kind == "cancel":
            error = GenerationError("Request cancelled", "cancelled")
            subs = [i for i in self._states if i.startswith(f"{request_id}/")]  # best_of
            for live_id in [request_id, *subs]:
                self.finish(live_id, error)
        elif request.best_of > 1:  # queued together: the later ones hit the first's pages
            group = BestOfGroup(request, stream.put_many)
            for i, sub in enumerate(group.sub_requests()):
                self.admit(f"{request_id}/{i}", sub, group.emitter(i))
        else:
            self.admit(request_id, request, stream.put_many)

    def admit(self, request_id: str, request: GenerationRequest, emit) -> None:
        """Build the request's record and queue it, or emit why not (a validation error)."""
        if request_id in self._states:
            emit([GenerationError(f"duplicate request id {request_id!r}", "validation")])
            return
        try:
            seq = new_request_state(
                request_id,
                request,
                emit,
                self._tokenizer,
                self._limits,
                prompt_logprobs_enabled=self._prompt_logprobs,
            )
        except Exception as exc:  # malformed fields (the server validates; tgix.LLM callers
            # may not): this request's error, never the engine loop's
            seq = GenerationError(f"invalid request: {type(exc).__name__}: {exc}", "validation")
        if isinstance(seq, GenerationError):
            emit([seq])
        elif not self.scheduler.add(seq):
            emit([GenerationError(NO_ROOM, "validation")])
        else:
            self._states[request_id] = seq

    # -- a step's tokens and endings --------------------------------------------------------------

    def commit_step(self, inflight: InFlight, result: StepResult, now: float) -> None:
        """A read-back step: record it in the scheduler, turn its tokens into events."""
        plan, rows = inflight.plan, inflight.rows
        accepted = {i: c for i, c in result.ids().items() if i in self._states}
        if inflight.committed_early:
            fill_placeholders(self._states, accepted)
            at_length: set[str] = set()
        else:
            at_length = set(self.scheduler.on_step_done(plan, accepted))
        for row, seq in zip(rows, inflight.seqs, strict=True):
            if seq is None or row.request_id not in self._states:
                continue  # ended (cancelled, failed, stopped) while this step ran
            seq.head_drafts = result.head_drafts.get(row.request_id)
            if row.request_id in result.prompt_logprobs and not seq.output.prefill:
                seq.output.set_prefill(result.prompt_logprobs[row.request_id])
            choices = result.accepted.get(row.request_id, ())
            if len(choices) > 1:  # accepted drafts: each joins output_ids as it is delivered,
                self._deliver_drafts(seq, choices, row.request_id in at_length, now)
                continue  # so a request ending inside them never counts what follows
            for choice in choices:
                if not self._deliver(seq, choice, row.request_id in at_length, now):
                    break

    def _deliver_drafts(self, seq: RequestState, choices, at_length: bool, now: float) -> None:
        """A verify row's accepted tokens (the scheduler appended them to output_ids), one by
        one, as if each came from its own step."""
        del seq.output_ids[len(seq.output_ids) - len(choices) :]
        for j, choice in enumerate(choices):
            last = j == len(choices) - 1
            seq.output_ids.append(choice.token_id)
            seq.accepted_drafts += j > 0
            if not self._deliver(seq, choice, at_length and last, now, last):
                break

    def _deliver(
        self, seq: RequestState, choice, at_length: bool, now: float, last: bool = True
    ) -> bool:
        """One accepted token to its stream; False once the request has ended. `last`: the
        row's last accepted token this step (a grammar's forced tokens follow only that)."""
        before = len(seq.output_ids)
        items, reason = commit_token(
            seq,
            choice,
            at_length=at_length,
            fast_forward=self._fast_forward and last,
            mask_ready=self._mask_ready,
        )
        self.fast_forwarded += len(seq.output_ids) - before
        if isinstance(reason, GenerationError):
            self.finish(seq.request_id, reason)
            return False
        if reason is not None:
            self.scheduler.finish(seq.request_id, reason)  # no-op when it finished at length
            del self._states[seq.request_id]
            items.append(
                seq.output.completion(
                    queue_time=(seq.started or now) - seq.submitted,
                    inference_time=now - (seq.started or now),
                    skipped_tokens=seq.accepted_drafts,
                )
            )
        if items and not seq.emit(items) and reason is None:
            self.finish(seq.request_id, None)  # the reader is gone
            return False
        if reason is None and last and not seq.waiting_for_mask:
            self._mask_ready(seq)  # its next mask: built, or the row is held meanwhile
        return reason is None

    def _mask_ready(self, seq: RequestState) -> bool:
        """Whether the grammar's mask at seq's state is built, after a bounded wait; if not,
        the row is held (the scheduler leaves it out until it is)."""
        grammar = seq.request.grammar
        if grammar is None or seq.grammar_failure is not None:
            return True
        ready = self.masks.wait(grammar, seq.grammar_state)
        if not ready:
            seq.waiting_for_mask = True
            self.masks.held += 1
        return ready

    def finish(self, request_id: str, error: GenerationError | None) -> None:
        """End a request now (cancelled when `error` is None): its pages go back at once."""
        seq = self._states.pop(request_id, None)
        self.scheduler.finish(request_id, "error" if error else "cancelled")
        if seq is not None and error is not None:
            seq.emit([error])

    def end_all(self, error: GenerationError) -> None:
        for request_id in list(self._states):
            self.finish(request_id, error)
