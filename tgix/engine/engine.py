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
import secrets
import threading
import time
import uuid
from collections.abc import Callable

from tgix.engine.best_of import BestOfGroup
from tgix.engine.output import RequestOutput
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest
from tgix.engine.runner import RowSampling, Runner
from tgix.engine.scheduler import ScheduledStep, Scheduler, SequenceState
from tgix.engine.stream import RequestStream

logger = logging.getLogger(__name__)

StepHook = Callable[..., None]  # (kind, duration_s, batch_size, num_tokens, *, ok)


class _Live:
    """Engine-thread state of one running or queued request."""

    __slots__ = ("emit", "output", "params", "request", "seq", "submitted", "started")

    def __init__(self, request, params, output, seq: SequenceState, emit):
        self.request, self.params, self.output, self.seq, self.emit = (
            request,
            params,
            output,
            seq,
            emit,
        )
        self.submitted = time.monotonic()
        self.started: float | None = None  # first scheduled

    def history(self) -> list[int]:
        if self.params.uses_penalties:
            return self.seq.prompt_ids + self.seq.output_ids
        if self.params.watermark:
            return (self.seq.prompt_ids + self.seq.output_ids)[-1:]
        return []


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
        self._live: dict[str, _Live] = {}
        self._stopping = False
        self._ready = False
        self._step_started: float | None = None
        self._last_step_done: float | None = None
        self._host_gaps: collections.deque[float] = collections.deque(maxlen=256)
        self._stats: dict[str, float] = {}
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

    # -- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_inbox()
                step = self.scheduler.schedule()
                if step is None:
                    self._last_step_done = None  # idle time is not a host gap
                    self._refresh_stats()
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self._execute(step)
                self._refresh_stats()
        except BaseException:
            logger.exception("engine loop died")
            raise
        finally:
            self._end_all(GenerationError("Engine is shutting down", "shutdown"))

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
        n_in, limits = len(request.prompt_ids), self.limits
        if (
            n_in > limits.max_input_tokens
            or n_in + request.max_new_tokens > limits.max_total_tokens
        ):
            why = (
                f"`inputs` tokens + `max_new_tokens` must be <= {limits.max_total_tokens}. "
                f"Given: {n_in} `inputs` tokens and {request.max_new_tokens} `max_new_tokens`"
            )
            if n_in > limits.max_input_tokens:
                why = (
                    f"`inputs` must have less than {limits.max_input_tokens} tokens. Given: {n_in}"
                )
            emit([GenerationError(why, "validation")])
            return
        params = request.sampling
        if params.is_sampling and params.seed is None:
            params = params.with_seed(secrets.randbits(64))
        seed = params.seed if params.is_sampling else None
        try:
            seq = self.scheduler.add(request_id, list(request.prompt_ids), request.max_new_tokens)
        except ValueError as exc:
            emit([GenerationError(str(exc), "validation")])
            return
        if seq.finish_reason == "error":
            why = "request does not fit the KV cache or the prefill budget"
            emit([GenerationError(why, "validation")])
            return
        output = RequestOutput(request, self.tokenizer, seed=seed)
        self._live[request_id] = _Live(request, params, output, seq, emit)

    def _execute(self, step: ScheduledStep) -> None:
        rows = step.rows
        lives = [self._live[r.request_id] for r in rows]
        sampling = [
            RowSampling(live.params, r.start_pos + len(r.token_ids), live.history())
            for r, live in zip(rows, lives, strict=True)
        ]
        want_prefill = self._prompt_logprobs and any(
            live.request.prompt_logprobs and not live.output.prefill and r.start_pos == 0
            for r, live in zip(rows, lives, strict=True)
        )
        now = time.monotonic()
        for live in lives:
            live.started = live.started or now
        self._step_started = now
        try:
            pending = self.runner.run(rows, sampling, prompt_logprobs=want_prefill)
            if self._last_step_done is not None:  # device idle: last results -> this dispatch
                self._host_gaps.append(self.runner.dispatched_at - self._last_step_done)
            out = Runner.fetch(pending)
        except Exception as exc:  # a failed step ends its requests, not the engine
            logger.exception("step failed")
            self._fail_step(step, exc)
            return
        finally:
            self._step_started = None
        done = time.monotonic()
        self._last_step_done = done
        kind = "prefill" if any(r.is_prefill for r in rows) else "decode"
        if self._on_step is not None:
            self._on_step(kind, done - now, len(rows), step.num_tokens, ok=True)
        sampled = {
            r.request_id: int(out.token_ids[i]) for i, r in enumerate(rows) if r.produces_token
        }
        at_length = set(self.scheduler.on_step_done(step, sampled))
        offset = 0
        for i, (row, live) in enumerate(zip(rows, lives, strict=True)):
            start, offset = offset, offset + len(row.token_ids)
            if want_prefill and live.request.prompt_logprobs and row.start_pos == 0:
                live.output.set_prefill(out.prompt_logprobs[start : offset - 1])
            if row.produces_token:
                self._on_token(live, row.request_id, out, i, row.request_id in at_length, done)

    def _on_token(self, live: _Live, request_id: str, out, i: int, at_length: bool, now: float):
        logprob = float(out.logprobs[i])
        if not math.isfinite(logprob) and logprob != -math.inf:
            self._finish(request_id, GenerationError("non-finite logits", "generation"))
            return
        n = live.request.top_n_tokens
        top = list(zip(out.top_ids[i][:n].tolist(), out.top_logprobs[i][:n].tolist(), strict=True))
        events, reason = live.output.add(int(out.token_ids[i]), logprob, top, at_length=at_length)
        items: list = list(events)
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

    def _finish(self, request_id: str, error: GenerationError | None) -> None:
        live = self._live.pop(request_id, None)
        self.scheduler.finish(request_id, "error" if error else "cancelled")
        if live is not None and error is not None:
            live.emit([error])

    def _fail_step(self, step: ScheduledStep, exc: Exception) -> None:
        error = GenerationError(f"{type(exc).__name__}: {exc}", "generation")
        for row in step.rows:
            self._finish(row.request_id, error)
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
        }
