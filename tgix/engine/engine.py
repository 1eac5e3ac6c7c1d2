"""The engine: one thread that makes every JAX call, turning submitted requests into streams.

The loop is inbox -> schedule -> execute -> commit. `submit` (any thread) puts a request in
the inbox and returns its RequestStream; the engine thread builds its RequestState and queues
it in the Scheduler; `schedule` returns the next StepPlan (admissions start past a cached
prefix); `execute` dispatches it to the Runner; `commit` reads it back, records it in the
scheduler (KV counts, full pages into the prefix cache, accepted ids) and runs each accepted
token through the request's RequestOutput (detokenize, stops, EOS) to its stream, the
Completion with the last one; the scheduler then releases its pages. Decode steps may run
one ahead of their read-back (runahead.py). `cancel` releases a request's pages at the next
step boundary. A failing step ends the requests in it with an error and the engine keeps
serving the others; a watchdog (`healthy`) reports whether steps still complete.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable

from tgix.engine.best_of import BestOfGroup
from tgix.engine.commit import commit_token, step_result
from tgix.engine.plan import StepPlan
from tgix.engine.prewarm import Prewarmer
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest, SamplingParams
from tgix.engine.request_state import RequestState, new_request_state
from tgix.engine.runahead import (
    InFlight,
    can_run_ahead,
    fill_placeholders,
    is_same_decode,
    placeholders,
    with_real_tokens,
)
from tgix.engine.runner import RowSampling, Runner
from tgix.engine.scheduler import Scheduler
from tgix.engine.stream import RequestStream

logger = logging.getLogger(__name__)

NO_ROOM = "request does not fit the KV cache or the prefill budget"
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
        self._live: dict[str, RequestState] = {}
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
                    plan = self.scheduler.schedule()
                    if plan is None:
                        self._last_step_done = None  # idle time is not a host gap
                        self._idle_since = self._idle_since or time.monotonic()
                        self._refresh_stats()
                        if self._prewarm_one():
                            continue
                        self._wake.wait(0.05)
                        self._wake.clear()
                        continue
                    self._idle_since = None
                    inflight = self._execute(plan, plan.rows)
                    if inflight is None:
                        continue
                ahead = self._schedule_ahead(inflight)
                self._commit(inflight)
                if isinstance(ahead, StepPlan):  # needed the tokens just read
                    ahead = self._execute(ahead, with_real_tokens(ahead.rows, self._live))
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
            elif request.best_of > 1:  # queued together: the later ones hit the first's pages
                group = BestOfGroup(request, stream.put_many)
                for i, sub in enumerate(group.sub_requests()):
                    self._admit(f"{request_id}/{i}", sub, group.emitter(i))
            else:
                self._admit(request_id, request, stream.put_many)

    def _admit(self, request_id: str, request: GenerationRequest, emit) -> None:
        if request_id in self._live:
            emit([GenerationError(f"duplicate request id {request_id!r}", "validation")])
            return
        seq = new_request_state(
            request_id,
            request,
            emit,
            self.tokenizer,
            self.limits,
            prompt_logprobs_enabled=self._prompt_logprobs,
        )
        if isinstance(seq, GenerationError):
            emit([seq])
        elif not self.scheduler.add(seq):
            emit([GenerationError(NO_ROOM, "validation")])
        else:
            self._live[request_id] = seq

    def _execute(self, plan: StepPlan, rows, token_ids=None) -> InFlight | None:
        """Send a step to the device (rows may carry patched token ids; `token_ids` is the
        previous step's device output when it feeds this one directly)."""
        seqs = [self._live.get(r.request_id) for r in rows]
        sampling = [
            RowSampling(seq.params, r.end_pos, seq.history())
            if seq is not None
            else RowSampling(SamplingParams(), r.start_pos + 1, [])  # ended meanwhile
            for r, seq in zip(rows, seqs, strict=True)
        ]
        masks = [
            seq.token_mask() if seq is not None and r.produces_token else None
            for r, seq in zip(rows, seqs, strict=True)
        ]
        now = time.monotonic()
        for seq in seqs:
            if seq is not None:
                seq.started = seq.started or now
        self._step_started = now
        try:
            handle = self.runner.run(
                rows,
                sampling,
                prompt_logprobs=plan.all_logits,
                device_token_ids=token_ids,
                token_masks=masks,
            )
        except Exception as exc:  # a failed step ends its requests, not the engine
            logger.exception("step failed")
            self._fail_step(plan, exc, committed_early=False)
            self._step_started = None
            return None
        if token_ids is not None:  # sent before the previous step was read: no idle gap
            self._host_gaps.append(0.0)
        elif self._last_step_done is not None:  # device idle from the last results to here
            self._host_gaps.append(self.runner.dispatched_at - self._last_step_done)
        return InFlight(plan, tuple(rows), seqs, handle, now)

    def _schedule_ahead(self, inflight: InFlight) -> InFlight | StepPlan | None:
        """Run-ahead (runahead.py): before reading a decode step back, commit it early with
        placeholders and schedule the next step. If it decodes the same rows, dispatch it now,
        fed by the device's sampled ids; otherwise return it to dispatch once the ids are
        known. Only when nothing is waiting (admissions and cancels take the synchronous
        path)."""
        if not self._overlap or inflight.plan.all_logits:
            return None
        if self._inbox or self.scheduler.num_waiting:
            return None
        if not can_run_ahead(inflight.rows, inflight.seqs):
            return None
        self.scheduler.on_step_done(inflight.plan, placeholders(inflight))
        inflight.committed_early = True
        plan = self.scheduler.schedule()
        if plan is None:
            return None
        if is_same_decode(plan, inflight):
            self._overlapped += 1
            return self._execute(plan, plan.rows, token_ids=inflight.handle.token_ids)
        return plan

    def _commit(self, inflight: InFlight) -> None:
        """Read a step back, record it in the scheduler, turn its tokens into events."""
        plan, rows = inflight.plan, inflight.rows
        self._step_started = inflight.started
        try:
            result = step_result(rows, Runner.fetch(inflight.handle))
        except Exception as exc:
            logger.exception("step failed")
            self._fail_step(plan, exc, committed_early=inflight.committed_early)
            return
        finally:
            self._step_started = None
        done = time.monotonic()
        self._last_step_done = done
        if self._on_step is not None:
            self._on_step(plan.kind, done - inflight.started, len(rows), plan.num_tokens, ok=True)
        accepted = {i: c for i, c in result.ids().items() if i in self._live}
        if inflight.committed_early:
            fill_placeholders(self._live, accepted)
            at_length: set[str] = set()
        else:
            at_length = set(self.scheduler.on_step_done(plan, accepted))
        for row, seq in zip(rows, inflight.seqs, strict=True):
            if seq is None or row.request_id not in self._live:
                continue  # ended (cancelled, failed, stopped) while this step ran
            if row.request_id in result.prompt_logprobs and not seq.output.prefill:
                seq.output.set_prefill(result.prompt_logprobs[row.request_id])
            for choice in result.accepted.get(row.request_id, ()):
                if not self._deliver(seq, choice, row.request_id in at_length, done):
                    break

    def _deliver(self, seq: RequestState, choice, at_length: bool, now: float) -> bool:
        """One accepted token to its stream; False once the request has ended."""
        before = len(seq.output_ids)
        items, reason = commit_token(
            seq, choice, at_length=at_length, fast_forward=self._fast_forward
        )
        self._fast_forwarded += len(seq.output_ids) - before
        if isinstance(reason, GenerationError):
            self._finish(seq.request_id, reason)
            return False
        if reason is not None:
            self.scheduler.finish(seq.request_id, reason)  # no-op when it finished at length
            del self._live[seq.request_id]
            items.append(
                seq.output.completion(
                    queue_time=(seq.started or now) - seq.submitted,
                    inference_time=now - (seq.started or now),
                )
            )
        if items and not seq.emit(items) and reason is None:
            self._finish(seq.request_id, None)  # the reader is gone
            return False
        return reason is None

    def _finish(self, request_id: str, error: GenerationError | None) -> None:
        seq = self._live.pop(request_id, None)
        self.scheduler.finish(request_id, "error" if error else "cancelled")
        if seq is not None and error is not None:
            seq.emit([error])

    def _fail_step(self, plan: StepPlan, exc: Exception, *, committed_early: bool) -> None:
        error = GenerationError(f"{type(exc).__name__}: {exc}", "generation")
        for row in plan.rows:
            self._finish(row.request_id, error)
        if not committed_early:  # else on_step_done already ran (with placeholders)
            self.scheduler.on_step_done(plan, {})
        if self.runner.kv_lost():
            self.runner.reset_kv()
            self.scheduler.requeue_all()
        if self._on_step is not None:
            self._on_step("prefill", 0.0, len(plan.rows), plan.num_tokens, ok=False)

    def _end_all(self, error: GenerationError) -> None:
        while self._inbox:
            kind, _, _, stream = self._inbox.popleft()
            if kind == "submit":
                stream.put_many([error])
        for request_id in list(self._live):
            self._finish(request_id, error)

    def _refresh_stats(self) -> None:
        s, kv = self.scheduler.stats(), self.scheduler.kv.stats()
        gaps = sorted(self._host_gaps)
        self._stats = {
            "queue_size": s["waiting"] + len(self._inbox),
            "batch_size": s["running"],
            "batch_max_tokens": s["held_pages"] * self.limits.page_size,
            "free_pages": kv["free_pages"],
            "used_pages": kv["used_pages"],
            "cached_pages": kv["cached_pages"],
            "shared_pages": kv["shared_pages"],
            "prefix_hit_tokens": kv["prefix_hit_tokens"],
            "prefix_lookup_tokens": kv["prefix_lookup_tokens"],
            "prefix_hit_rate": kv["prefix_hit_rate"],
            "prefix_evictions": kv["evictions"],
            "preemptions": s["preemptions"],
            "steps": s["steps"],
            "host_gap_ms_median": 1e3 * gaps[len(gaps) // 2] if gaps else 0.0,
            "overlapped_steps": self._overlapped,
            "fast_forwarded_tokens": self._fast_forwarded,
        }
