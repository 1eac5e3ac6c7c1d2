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

This module holds the thread and its loop; each request's admission, token delivery and end
are live_requests.py, the counters behind `stats()` engine_stats.py, a step's per-row
sampling and masks step_inputs.py, the thread that builds lazily built grammars' masks
while steps run mask_builder.py (a row whose next mask is not ready sits steps out), the
drafts that decode rows verify with `speculate` > 0 speculate.py (such a step is not run
ahead: its drafts come from the previous step's tokens).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable

from tgix.engine.commit import step_result
from tgix.engine.engine_stats import EngineStats
from tgix.engine.live_requests import NO_ROOM, LiveRequests
from tgix.engine.mask_builder import DEFAULT_WAIT_MS, MaskBuilder
from tgix.engine.plan import StepPlan
from tgix.engine.prewarm import Prewarmer
from tgix.engine.request import EngineLimits, GenerationError, GenerationRequest
from tgix.engine.runahead import (
    InFlight,
    can_run_ahead,
    is_same_decode,
    placeholders,
    with_real_tokens,
)
from tgix.engine.runner import Runner
from tgix.engine.scheduler import Scheduler
from tgix.engine.speculate import (
    MedusaProposer,
    NgramProposer,
    Proposer,
    may_draft,
    plan_draft,
)
from tgix.engine.step_inputs import request_images, row_inputs
from tgix.engine.stream import RequestStream

__all__ = ["NO_ROOM", "PREWARM_AFTER_S", "Engine", "StepHook"]

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
        mask_wait_s: float | None = DEFAULT_WAIT_MS / 1000,
        mask_ahead: bool = False,
        proposer: Proposer | None = None,
    ):
        self.runner, self.scheduler = runner, scheduler
        self.tokenizer, self.limits = tokenizer, limits
        self.model_id = model_id
        self._stall_timeout = stall_timeout_s
        self._on_step = on_step
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Event()
        # forced grammar tokens join the next step as extra input tokens of their row: needs
        # the mixed (chunked-prefill) step shapes; otherwise each is masked in its own step
        self._live = LiveRequests(
            scheduler,
            tokenizer,
            limits,
            prompt_logprobs=prompt_logprobs,
            fast_forward=bool(runner.config.buckets.mixed_tokens),
            masks=MaskBuilder(mask_wait_s, on_ready=self._wake.set, ahead=mask_ahead),
        )
        self._stopping = False
        self._ready = False
        self._step_started: float | None = None
        self._stats = EngineStats()
        self._overlap = overlap
        self._prewarm = Prewarmer(runner) if prewarm else None  # idle-time first calls
        self._idle_since: float | None = None  # monotonic time the engine last went idle
        self.grammar_compiler = None  # tgix.grammar.GrammarCompiler, set by the factory
        self.vision = None  # a VLM's VisionPrompts (tgix.engine.vision_inputs), set by the factory
        # a step passes its rows' image embeddings (and M-RoPE rows) only where the model reads them
        self._takes_images = runner.config.buckets.images or bool(runner.cfg.mrope_section)
        config = scheduler.config
        self.speculate = config.speculate if config.speculate_rows else 0  # draft tokens
        heads = runner.config.draft_head_rows > 0  # a Medusa model: its heads draft
        # drafts' source (replaceable)
        self.proposer: Proposer = proposer or (MedusaProposer() if heads else NgramProposer())
        if self.speculate:  # decode rows carry drafts (speculate.py), verified in the step
            eos = frozenset(tokenizer.eos_token_ids)
            scheduler.drafter = lambda seq: plan_draft(seq, self.proposer, self.speculate, eos)
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
        return dict(self._stats.current)

    @property
    def mask_builder(self) -> MaskBuilder:
        """Builds lazy grammars' masks off this thread (its `budget_s` may be changed live)."""
        return self._live.masks

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the loop; every unfinished request ends with a "shutdown" error."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.runner.release()
        if self.runner.broadcast is not None:  # the other processes of a group stop too
            self.runner.broadcast(("stop",))
            self.runner.broadcast = None
        self._live.masks.close()
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
                        self._stats.went_idle()
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
            self._live.take(*self._inbox.popleft())

    def _execute(self, plan: StepPlan, rows, token_ids=None) -> InFlight | None:
        """Send a step to the device (rows may carry patched token ids; `token_ids` is the
        previous step's device output when it feeds this one directly)."""
        seqs = [self._live.get(r.request_id) for r in rows]
        sampling, masks = row_inputs(rows, seqs, verify=plan.verify)
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
                verify=plan.verify,
                images=request_images(seqs) if self._takes_images else None,
            )
        except Exception as exc:  # a failed step ends its requests, not the engine
            logger.exception("step failed")
            self._fail_step(plan, exc, committed_early=False)
            self._step_started = None
            return None
        self._stats.dispatched(self.runner.dispatched_at, chained=token_ids is not None)
        return InFlight(plan, tuple(rows), seqs, handle, now)

    def _schedule_ahead(self, inflight: InFlight) -> InFlight | StepPlan | None:
        """Run-ahead (runahead.py): before reading a decode step back, commit it early with
        placeholders and schedule the next step. If it decodes the same rows, dispatch it now,
        fed by the device's sampled ids; otherwise return it to dispatch once the ids are
        known. Only when nothing is waiting (admissions and cancels take the synchronous
        path)."""
        if not self._overlap or inflight.plan.all_logits or inflight.plan.verify:
            return None
        drafting = self.speculate and len(inflight.rows) <= self.scheduler.config.speculate_rows
        if drafting and any(s is not None and may_draft(s, self.proposer) for s in inflight.seqs):
            return None  # the next step may draft: its drafts need this step's tokens
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
            self._stats.overlapped += 1
            return self._execute(plan, plan.rows, token_ids=inflight.handle.token_ids)
        return plan

    def _commit(self, inflight: InFlight) -> None:
        """Read a step back, record it in the scheduler, turn its tokens into events."""
        plan, rows = inflight.plan, inflight.rows
        self._step_started = inflight.started
        try:
            out = Runner.fetch(inflight.handle)
            result = step_result(rows, out, verify=plan.verify)
        except Exception as exc:
            logger.exception("step failed")
            self._fail_step(plan, exc, committed_early=inflight.committed_early)
            return
        finally:
            self._step_started = None
        done = time.monotonic()
        self._stats.read_back(done, expert_load=out.expert_load)
        if self._on_step is not None:
            self._on_step(plan.kind, done - inflight.started, len(rows), plan.num_tokens, ok=True)
        self._live.commit_step(inflight, result, done)

    def _fail_step(self, plan: StepPlan, exc: Exception, *, committed_early: bool) -> None:
        error = GenerationError(f"{type(exc).__name__}: {exc}", "generation")
        for row in plan.rows:
            self._live.finish(row.request_id, error)
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
        self._live.end_all(error)

    def _refresh_stats(self) -> None:
        self._stats.refresh(
            self.scheduler,
            queued=len(self._inbox),
            page_size=self.limits.page_size,
            fast_forwarded=self._live.fast_forwarded,
        )
