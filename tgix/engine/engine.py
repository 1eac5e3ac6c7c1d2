"""The engine: one thread that makes every JAX call, turning submitted requests into streams.

Lifecycle of a request: `submit` (any thread) puts it in the inbox and returns its
RequestStream -> the engine thread hands it to the Scheduler (FCFS queue) -> a step admits
it (prefill) and later steps decode it -> each step's sampled ids go through its
RequestOutput (detokenize, stops, EOS) -> events are delivered to the stream, the Completion
with the last token -> the scheduler frees its pages. `cancel` frees a request's pages at
the next step boundary. A failing step ends the requests in it with an error and the engine
keeps serving the others; a watchdog (`healthy`) reports whether steps still complete.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable

from tgix.engine.best_of import BestOfGroup
from tgix.engine.live import (
    PLACEHOLDER,
    InFlight,
    LiveRequest,
    admit,
    can_run_ahead,
    with_real_tokens,
)
from tgix.engine.prewarm import Prewarmer
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest, SamplingParams
from tgix.engine.runner import RowSampling, Runner
from tgix.engine.scheduler import ScheduledStep, Scheduler
from tgix.engine.stream import RequestStream

logger = logging.getLogger(__name__)

PREWARM_AFTER_S = 1.0  # idle this long before running warm-up steps
StepHook = Callable[..., None]  # (kind, duration_s, batch_size, num_tokens, *, ok)


class Engine:
    """Owns the scheduler and the runner; see the module docstring for the request flow."""

    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        tokenizer,
        limits: EngineLimits,
        *,
        model_id: str = "",
        prompt_logprobs: bool = False,
        stall_timeout_s: float = 120.0,
        on_step: StepHook | None = None,
        overlap: bool = True,
        prewarm: bool = False,
    ):
        self.runner, self.scheduler, self.tokenizer, self.limits = (
            runner,
            scheduler,
            tokenizer,
            limits,
        )
        self.model_id = model_id
        self._prompt_logprobs = prompt_logprobs
        self._stall_timeout = stall_timeout_s
        self._on_step = on_step
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._live: dict[str, LiveRequest] = {}
        self._stopping = False
        self._ready = False
        self._step_started: float | None = None
        self._last_step_done: float | None = None
        self._host_gaps: collections.deque[float] = collections.deque(maxlen=256)
        self._stats: dict[str, float] = {}
        self._overlap = overlap
        self._prewarm = Prewarmer(runner) if prewarm else None  # idle-time first calls
        self._idle_since: float | None = None  # monotonic time the engine last went idle
        self._overlapped = 0  # steps dispatched before the previous one was read back
        self.grammar_compiler = None  # tgix.grammar.GrammarCompiler, set by the factory
        # forced grammar tokens join the next step as extra input tokens of their row: needs
        # the mixed (chunked-prefill) step shapes; otherwise each is masked in its own step
        self._fast_forward = bool(runner.config.buckets.mixed_tokens)
        self._fast_forwarded = 0
        self._thread = threading.Thread(target=self._run, name="tgix-engine", daemon=True)
        self._thread.start()

    # -- public API (any thread) ----------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a request; iterate the returned stream for its events."""
        request_id = request.request_id or uuid.uuid4().hex
        stream = RequestStream(request_id, self.cancel)
        if self._stopping:
            stream.put_many([GenerationError("Engine is shutting down", "shutdown")])
        else:
            self._inbox.append(("submit", request_id, request, stream))
            self._wake.set()
        return stream

    def cancel(self, request_id: str) -> None:
        self._inbox.append(("cancel", request_id, None, None))
        self._wake.set()

    def warmup(self, timeout_s: float = 600.0, *, run_request: bool = True) -> None:
        """Run one tiny request end to end (unless run_request is False), then report
        healthy."""
        if not run_request:
            self._ready = True
            return
        prompt = (self.tokenizer.bos_token_id or 0,) * 2
        stream = self.submit(GenerationRequest(prompt_ids=prompt, max_new_tokens=2))
        deadline = time.monotonic() + timeout_s
        for _ in stream:
            if time.monotonic() > deadline:
                raise TimeoutError("warm-up did not finish")
        self._ready = True

    def healthy(self) -> bool:
        """Warmed up, thread alive, and no step running longer than the stall timeout."""
        started = self._step_started
        stalled = started is not None and time.monotonic() - started > self._stall_timeout
        return self._ready and self._thread.is_alive() and not self._stopping and not stalled

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the loop; every unfinished request ends with a "shutdown" error."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self.runner.broadcast is not None:  # the other processes of a group stop too
            self.runner.broadcast(("stop",))
            self.runner.broadcast = None
        if self.grammar_compiler is not None:
            self.grammar_compiler.close()

    # -- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            inflight: InFlight | None = None
            while not self._stopping:
                if inflight is None:
                    self._drain_inbox()
                    step = self.scheduler.schedule()
                    if step is None:
                        self._last_step_done = None  # idle time is not a host gap
                        self._idle_since = self._idle_since or time.monotonic()
                        self._refresh_stats()
                        if self._prewarm_one():
                            continue
                        self._wake.wait(0.05)
                        self._wake.clear()
                        continue
                    self._idle_since = None
                    inflight = self._dispatch(step, step.rows)
                    if inflight is None:
                        continue
                ahead = self._schedule_ahead(inflight)
                self._complete(inflight)
                if isinstance(ahead, ScheduledStep):  # needed the tokens just read
                    ahead = self._dispatch(ahead, with_real_tokens(ahead.rows, self._live))
                inflight = ahead
                self._refresh_stats()
        except BaseException:
            logger.exception("engine loop died")
            raise
        finally:
            self._end_all(GenerationError("Engine is shutting down", "shutdown"))

    def _prewarm_one(self) -> bool:
        """Idle for PREWARM_AFTER_S: run one executable that has not run yet (prewarm.py),
        unless other processes follow this one's steps. A closed-loop client leaves the
        engine idle for milliseconds between requests; a warm-up there would hold up the
        next admission (measured: 0.3 s more time to first token). False: nothing run."""
        if self._prewarm is None or not self._ready or self.runner.broadcast is not None:
            return False
        if time.monotonic() - (self._idle_since or time.monotonic()) < PREWARM_AFTER_S:
            return False
        try:
            return self._prewarm.step()
        except Exception:  # never fatal: that shape pays its first call when used
            logger.exception("prewarm failed; stopping it")
            self._prewarm = None
            self.runner.reset_kv()  # its pages may have been donated to the failed call
            return False

    def _drain_inbox(self) -> None:
        while self._inbox:
            kind, request_id, request, stream = self._inbox.popleft()
            if kind == "cancel":
                error = GenerationError("Request cancelled", "cancelled")
                subs = [i for i in self._live if i.startswith(f"{request_id}/")]  # best_of
                for live_id in [request_id, *subs]:
                    self._finish(live_id, error)
            elif request.best_of > 1:
                group = BestOfGroup(request, stream.put_many)
                for i, sub in enumerate(group.sub_requests()):
                    self._admit(f"{request_id}/{i}", sub, group.emitter(i))
            else:
                self._admit(request_id, request, stream.put_many)

    def _admit(self, request_id: str, request: GenerationRequest, emit) -> None:
        if request_id in self._live:
            emit([GenerationError(f"duplicate request id {request_id!r}", "validation")])
            return
        live = admit(request_id, request, emit, self.scheduler, self.tokenizer, self.limits)
        if isinstance(live, GenerationError):
            emit([live])
        else:
            self._live[request_id] = live

    def _dispatch(self, step: ScheduledStep, rows, token_ids=None) -> InFlight | None:
        """Send a step to the device (rows may carry patched token ids; `token_ids` is the
        previous step's device output when it feeds this one directly)."""
        lives = [self._live.get(r.request_id) for r in rows]
        sampling = [
            RowSampling(live.params, r.start_pos + len(r.token_ids), live.history())
            if live is not None
            else RowSampling(SamplingParams(), r.start_pos + 1, [])  # ended meanwhile
            for r, live in zip(rows, lives, strict=True)
        ]
        want_prefill = self._prompt_logprobs and any(
            live is not None
            and live.request.prompt_logprobs
            and not live.output.prefill
            and r.start_pos == 0
            for r, live in zip(rows, lives, strict=True)
        )
        masks = [
            live.token_mask() if live is not None and r.produces_token else None
            for r, live in zip(rows, lives, strict=True)
        ]
        now = time.monotonic()
        for live in lives:
            if live is not None:
                live.started = live.started or now
        self._step_started = now
        try:
            handle = self.runner.run(
                rows,
                sampling,
                prompt_logprobs=want_prefill,
                device_token_ids=token_ids,
                token_masks=masks,
            )
        except Exception as exc:  # a failed step ends its requests, not the engine
            logger.exception("step failed")
            self._fail_step(step, exc, speculated=False)
            self._step_started = None
            return None
        if token_ids is not None:  # sent before the previous step was read: no idle gap
            self._host_gaps.append(0.0)
        elif self._last_step_done is not None:  # device idle from the last results to here
            self._host_gaps.append(self.runner.dispatched_at - self._last_step_done)
        return InFlight(step, tuple(rows), lives, handle, want_prefill, now)

    def _schedule_ahead(self, inflight: InFlight) -> InFlight | ScheduledStep | None:
        """Overlap: before reading a decode step back, record its tokens as placeholders and
        schedule the next step. If it decodes the same rows, dispatch it now, fed by the
        device's sampled ids; otherwise return it to dispatch once the ids are known. Only
        when nothing is waiting (admissions and cancels take the synchronous path) and no row
        needs its token history (penalties, watermark) or ends by length at this step."""
        if not self._overlap or inflight.want_prefill or self._inbox or self.scheduler.num_waiting:
            return None
        if not can_run_ahead(inflight.rows, inflight.lives):
            return None
        placeholders = {r.request_id: PLACEHOLDER for r in inflight.rows}
        self.scheduler.on_step_done(inflight.step, placeholders)
        inflight.speculated = True
        step = self.scheduler.schedule()
        if step is None:
            return None
        same = [r.request_id for r in step.rows] == [r.request_id for r in inflight.rows]
        if same and all(not r.is_prefill and len(r.token_ids) == 1 for r in step.rows):
            self._overlapped += 1
            return self._dispatch(step, step.rows, token_ids=inflight.handle.token_ids)
        return step

    def _complete(self, inflight: InFlight) -> None:
        """Read a step back and turn its sampled ids into events."""
        step, rows, lives = inflight.step, inflight.rows, inflight.lives
        self._step_started = inflight.started
        try:
            out = Runner.fetch(inflight.handle)
        except Exception as exc:
            logger.exception("step failed")
            self._fail_step(step, exc, speculated=inflight.speculated)
            return
        finally:
            self._step_started = None
        done = time.monotonic()
        self._last_step_done = done
        kind = "prefill" if any(r.is_prefill for r in rows) else "decode"
        if self._on_step is not None:
            self._on_step(kind, done - inflight.started, len(rows), step.num_tokens, ok=True)
        sampled = {
            r.request_id: int(out.token_ids[i]) for i, r in enumerate(rows) if r.produces_token
        }
        if inflight.speculated:  # on_step_done already ran with placeholders: fill them in
            at_length: set[str] = set()
            for request_id, token in sampled.items():
                live = self._live.get(request_id)
                if live is not None and live.seq.output_ids[-1:] == [PLACEHOLDER]:
                    live.seq.output_ids[-1] = token
        else:
            live_ids = {i for i in sampled if i in self._live}
            sampled = {i: t for i, t in sampled.items() if i in live_ids}
            at_length = set(self.scheduler.on_step_done(step, sampled))
        offset = 0
        for i, (row, live) in enumerate(zip(rows, lives, strict=True)):
            start, offset = offset, offset + len(row.token_ids)
            if live is None or row.request_id not in self._live:
                continue  # ended (cancelled, failed, stopped) while this step ran
            if inflight.want_prefill and live.request.prompt_logprobs and row.start_pos == 0:
                live.output.set_prefill(out.prompt_logprobs[start : offset - 1])
            if row.produces_token:
                self._on_token(live, row.request_id, out, i, row.request_id in at_length, done)

    def _on_token(
        self, live: LiveRequest, request_id: str, out, i: int, at_length: bool, now: float
    ):
        logprob = float(out.logprobs[i])
        if not math.isfinite(logprob) and logprob != -math.inf:
            self._finish(request_id, GenerationError("non-finite logits", "generation"))
            return
        if not live.advance_grammar(int(out.token_ids[i])):
            error = GenerationError("sampled a token the grammar forbids", "generation")
            self._finish(request_id, error)
            return
        n = live.request.top_n_tokens
        top = list(zip(out.top_ids[i][:n].tolist(), out.top_logprobs[i][:n].tolist(), strict=True))
        events, reason = live.output.add(int(out.token_ids[i]), logprob, top, at_length=at_length)
        items: list = list(events)
        if reason is None and self._fast_forward and live.request.grammar is not None:
            reason = self._fast_forward_tokens(live, items)
        if reason is not None:
            self.scheduler.finish(request_id, reason)  # no-op when it finished at length
            del self._live[request_id]
            items.append(
                live.output.completion(
                    queue_time=(live.started or now) - live.submitted,
                    inference_time=now - (live.started or now),
                )
            )
        if items and not live.emit(items) and reason is None:
            self._finish(request_id, None)  # the reader is gone

    def _fast_forward_tokens(self, live: LiveRequest, items: list) -> str | None:
        """Append the grammar's forced continuation (the only allowed token, again and again)
        without sampling: the tokens are emitted now with logprob 0 (probability 1 under the
        mask) and the scheduler feeds them to the model with the next step's row. Stops one
        token short of max_new_tokens so the step still samples."""
        room = live.seq.max_new_tokens - len(live.seq.output_ids) - 1
        reason = None
        while room > 0 and reason is None:
            forced = live.request.grammar.forced_token(live.grammar_state)
            if forced is None:
                break
            live.seq.output_ids.append(forced)
            live.advance_grammar(forced)
            top = [(forced, 0.0)][: live.request.top_n_tokens]
            events, reason = live.output.add(forced, 0.0, top)
            items.extend(events)
            self._fast_forwarded += 1
            room -= 1
        return reason

    def _finish(self, request_id: str, error: GenerationError | None) -> None:
        live = self._live.pop(request_id, None)
        self.scheduler.finish(request_id, "error" if error else "cancelled")
        if live is not None and error is not None:
            live.emit([error])

    def _fail_step(self, step: ScheduledStep, exc: Exception, *, speculated: bool) -> None:
        error = GenerationError(f"{type(exc).__name__}: {exc}", "generation")
        for row in step.rows:
            self._finish(row.request_id, error)
        if not speculated:  # else on_step_done already ran (with placeholders)
            self.scheduler.on_step_done(step, {})
        if any(layer.k.is_deleted() for layer in self.runner.kv):  # donated, then lost
            self.runner.reset_kv()
            self.scheduler.requeue_all()
        if self._on_step is not None:
            self._on_step("prefill", 0.0, len(step.rows), step.num_tokens, ok=False)

    def _end_all(self, error: GenerationError) -> None:
        while self._inbox:
            kind, _, _, stream = self._inbox.popleft()
            if kind == "submit":
                stream.put_many([error])
        for request_id in list(self._live):
            self._finish(request_id, error)

    def _refresh_stats(self) -> None:
        s = self.scheduler.stats()
        gaps = sorted(self._host_gaps)
        self._stats = {
            "queue_size": s["waiting"] + len(self._inbox),
            "batch_size": s["running"],
            "batch_max_tokens": s["held_pages"] * self.limits.page_size,
            "free_pages": s["free_pages"],
            "used_pages": self.scheduler.allocator.num_used,
            "preemptions": s["preemptions"],
            "steps": s["steps"],
            "host_gap_ms_median": 1e3 * gaps[len(gaps) // 2] if gaps else 0.0,
            "overlapped_steps": self._overlapped,
            "fast_forwarded_tokens": self._fast_forwarded,
        }
