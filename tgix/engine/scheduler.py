"""Continuous-batching scheduler (host only): picks each step's rows (decode tokens, prefill chunks)
under TGI's budgets, owns every request's KV pages, and preempts by recompute under page pressure.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from tgix.engine.pages import PageAllocator


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """TGI's launcher knobs (same names and defaults); see reference §5 for their meaning."""

    max_batch_prefill_tokens: int = 4096
    max_batch_total_tokens: int | None = None  # None -> the allocator's capacity
    max_batch_size: int | None = None
    max_waiting_tokens: int = 20
    waiting_served_ratio: float = 0.3
    chunked_prefill: bool = False

    def __post_init__(self) -> None:
        total, size = self.max_batch_total_tokens, self.max_batch_size
        valid = {
            "max_batch_prefill_tokens": self.max_batch_prefill_tokens > 0,
            "max_batch_total_tokens": total is None or total > 0,
            "max_batch_size": size is None or size > 0,
            "max_waiting_tokens": self.max_waiting_tokens >= 0,
            "waiting_served_ratio": self.waiting_served_ratio >= 0,  # False for NaN too
        }
        for name, ok in valid.items():
            if not ok:
                raise ValueError(f"{name} out of range: {getattr(self, name)!r}")


class Status(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class SequenceState:
    """Host state of one request. The caller keeps the object returned by `Scheduler.add` to read
    `output_ids` and `finish_reason`; the scheduler forgets a request once it finishes."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    prefilled: bool = False  # its last prefill chunk ran: from now on it decodes one token a step

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One request's share of a step; has RowInput's fields, so `pack_step(step.rows, ...)` works.

    `pages` covers at least start_pos + len(token_ids) tokens (a prefill reserves its whole length).
    `produces_token` is False for a prefill chunk that stops short of the end of its sequence.
    """

    request_id: str
    token_ids: tuple[int, ...]
    start_pos: int
    pages: tuple[int, ...]
    is_prefill: bool
    produces_token: bool


@dataclass(frozen=True, slots=True)
class ScheduledStep:
    """The rows of one forward, decode rows first, then prefill rows (each in admission order)."""

    rows: tuple[ScheduledRow, ...]

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.rows]

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)


class Scheduler:
    """FCFS continuous batching over one PageAllocator; one step in flight at a time."""

    def __init__(self, config: SchedulerConfig, allocator: PageAllocator):
        self.config = config
        self.allocator = allocator
        limit = allocator.num_pages - 1
        if config.max_batch_total_tokens is not None:
            limit = min(limit, config.max_batch_total_tokens // allocator.page_size)
        if limit < 1:
            raise ValueError("max_batch_total_tokens is smaller than one page")
        self.page_limit = limit  # pages running requests may hold together (token budget / pool)
        self._seqs: dict[str, SequenceState] = {}  # live requests: waiting or running
        self._waiting: deque[SequenceState] = deque()
        # admission order: the last one is the preemption victim
        self._running: list[SequenceState] = []
        self._held = 0
        self._waiting_tokens = 1  # TGI's counter: 1 + decode steps since the last admission
        self._inflight: ScheduledStep | None = None
        self._preemptions = 0
        self._steps = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def stats(self) -> dict[str, int]:
        return {
            "waiting": self.num_waiting,
            "running": self.num_running,
            "held_pages": self._held,
            "page_limit": self.page_limit,
            "free_pages": self.allocator.num_free,
            "waiting_tokens": self._waiting_tokens,
            "preemptions": self._preemptions,
            "steps": self._steps,
        }

    def add(self, request_id: str, prompt_ids: list[int], max_new_tokens: int) -> SequenceState:
        """Queue a request (FCFS). One that can never run is returned already finished ("error")
        so that it cannot block the queue forever; the server should have refused it (422)."""
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already queued or running")
        if not prompt_ids or max_new_tokens < 1:
            raise ValueError("need a non-empty prompt and max_new_tokens >= 1")
        seq = SequenceState(request_id, list(prompt_ids), max_new_tokens)
        # Peak KV: every prompt token plus every generated token but the last (never fed back).
        peak = self.allocator.pages_for(len(prompt_ids) + max_new_tokens - 1)
        too_long = not self.config.chunked_prefill and (
            len(prompt_ids) > self.config.max_batch_prefill_tokens
        )
        if peak > self.page_limit or too_long:
            seq.status, seq.finish_reason = Status.FINISHED, "error"
            return seq
        self._seqs[request_id] = seq
        self._waiting.append(seq)
        return seq

    def finish(self, request_id: str, reason: str) -> None:
        """End a request now (EOS, stop sequence, cancel, client gone) and free its pages.
        Unknown or already finished ids are ignored, so cancel races are harmless."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        if seq.status is Status.WAITING:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            self._release(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def schedule(self) -> ScheduledStep | None:
        """The next step's rows, with their pages allocated; None when there is nothing to run."""
        if self._inflight is not None:
            raise RuntimeError("the previous step has not been reported with on_step_done")
        rows = self._chunked_rows() if self.config.chunked_prefill else self._classic_rows()
        if not rows:
            return None
        self._inflight = ScheduledStep(tuple(rows))
        self._steps += 1
        return self._inflight

    def on_step_done(self, step: ScheduledStep, sampled: dict[str, int]) -> list[str]:
        """Record the step: advance KV counts, append each producing row's sampled token, finish
        requests at max_new_tokens ("length"). Returns the ids finished here. Rows of requests
        finished meanwhile (cancelled during the step) are skipped."""
        if step is not self._inflight:
            raise ValueError("not the step in flight")
        producing = {r.request_id for r in step.rows if r.produces_token}
        if extra := set(sampled) - producing:
            raise ValueError(f"tokens for rows that produce none: {sorted(extra)}")
        live = [  # rows of requests not finished meanwhile
            r
            for r in step.rows
            if (s := self._seqs.get(r.request_id)) is not None and s.status is Status.RUNNING
        ]
        if missing := {r.request_id for r in live if r.produces_token} - set(sampled):
            raise ValueError(f"no sampled token for {sorted(missing)}")
        self._inflight = None
        finished = []
        for row in live:
            seq = self._seqs[row.request_id]
            seq.num_computed += len(row.token_ids)
            if row.produces_token:
                seq.output_ids.append(sampled[row.request_id])
                seq.prefilled = True
                if len(seq.output_ids) >= seq.max_new_tokens:
                    self.finish(seq.request_id, "length")
                    finished.append(seq.request_id)
        return finished

    def requeue_all(self) -> None:
        """Preempt every running request (their KV was lost): they recompute from the front."""
        for seq in reversed(list(self._running)):
            self._preempt(seq)

    # -- step building ---------------------------------------------------------------------------

    def _classic_rows(self) -> list[ScheduledRow]:
        """TGI without chunking: admit (and prefill alone) or decode every running request."""
        cfg, running = self.config, len(self._running)
        min_size = None
        max_size = cfg.max_batch_size
        if running:
            if self._waiting_tokens < cfg.max_waiting_tokens:
                min_size = int(running * cfg.waiting_served_ratio)
            if max_size is not None:
                max_size -= running
        admitted = self._admit(min_size, max_size, cfg.max_batch_prefill_tokens)
        if admitted:
            self._waiting_tokens = 1
            return [self._row(seq, n) for seq, n in admitted]
        if not running:
            return []
        self._grow_for_decode()
        if not self._running:  # everything preempted (pool shared with someone else): re-admit
            return self._classic_rows()
        self._waiting_tokens += 1
        return [self._row(seq) for seq in self._running]

    def _chunked_rows(self) -> list[ScheduledRow]:
        """TGI with chunking: decode everyone, continue partial prefills, then admit new
        requests into what is left of the prefill budget (1 token per decode row)."""
        self._grow_for_decode()
        budget = self.config.max_batch_prefill_tokens
        decode = [self._row(s) for s in self._running if s.prefilled]
        budget -= sum(len(r.token_ids) for r in decode)
        prefill = []
        for seq in self._running:
            if not seq.prefilled and budget > 0:
                n = min(seq.total_len - seq.num_computed, budget)
                prefill.append(self._row(seq, n))
                budget -= n
        max_size = self.config.max_batch_size
        if max_size is not None:
            max_size -= len(self._running)
        prefill += [self._row(s, n) for s, n in self._admit(None, max_size, budget)]
        return decode + prefill

    def _admit(
        self, min_size: int | None, max_size: int | None, budget: int
    ) -> list[tuple[SequenceState, int]]:
        """TGI's next_batch: take from the queue front while pages and the prefill budget allow
        (head-of-line blocking), reserving pages for each one's whole sequence. Returns
        (sequence, first chunk length) pairs, now running."""
        if (min_size and len(self._waiting) < min_size) or max_size == 0 or budget <= 0:
            return []
        chunked = self.config.chunked_prefill
        taken: list[tuple[SequenceState, int]] = []
        tokens, pages_left = 0, self._available()
        for seq in self._waiting:
            if max_size is not None and len(taken) >= max_size:
                break
            need = self.allocator.pages_for(seq.total_len)
            if need > pages_left:
                break
            n = seq.total_len
            if chunked:
                n = min(n, budget - tokens)
            # The first request may exceed the budget: only a recompute can (new prompts that do
            # not fit were refused by add), and it must not be starved.
            elif taken and tokens + n > budget:
                break
            taken.append((seq, n))
            tokens += n
            pages_left -= need
            if tokens >= budget:
                break
        if min_size and len(taken) < min_size:
            return []
        for seq, _ in taken:
            self._waiting.popleft()
            seq.status = Status.RUNNING
            self._running.append(seq)
            self._grow(seq, self.allocator.pages_for(seq.total_len))
        return taken

    def _grow_for_decode(self) -> None:
        """Give each decoding request the page its next token needs, oldest first; when none is
        left, preempt the youngest running request (possibly the one asking)."""
        for seq in list(self._running):
            if seq.status is not Status.RUNNING or not seq.prefilled:
                continue
            need = self.allocator.pages_for(seq.total_len) - len(seq.pages)
            while need > self._available() and seq.status is Status.RUNNING:
                self._preempt(self._running[-1])
            if seq.status is Status.RUNNING:
                self._grow(seq, len(seq.pages) + need)

    def _preempt(self, seq: SequenceState) -> None:
        """Recompute preemption: drop its KV, keep its tokens, put it back at the queue front."""
        self._running.remove(seq)
        self._release(seq)
        seq.num_computed, seq.prefilled, seq.status = 0, False, Status.WAITING
        self._waiting.appendleft(seq)
        self._preemptions += 1

    # -- pages and rows --------------------------------------------------------------------------

    def _available(self) -> int:
        return min(self.allocator.num_free, self.page_limit - self._held)

    def _grow(self, seq: SequenceState, num_pages: int) -> None:
        extra = num_pages - len(seq.pages)
        if extra > 0:
            seq.pages += self.allocator.allocate(extra)
            self._held += extra

    def _release(self, seq: SequenceState) -> None:
        self.allocator.free(seq.pages)
        self._held -= len(seq.pages)
        seq.pages = []

    def _row(self, seq: SequenceState, n: int = 1) -> ScheduledRow:
        """A decode row once prefilled: every token without KV yet (the last sampled one, plus
        any the engine appended: grammar fast-forward); else the next n pending tokens."""
        start = seq.num_computed
        if seq.prefilled:
            ids = tuple(seq.output_ids[start - len(seq.prompt_ids) :])
        else:
            ids = tuple((seq.prompt_ids + seq.output_ids)[start:][:n])
        done = start + len(ids) == seq.total_len
        return ScheduledRow(seq.request_id, ids, start, tuple(seq.pages), not seq.prefilled, done)
