"""Continuous-batching scheduler (host only): picks each step's rows under TGI's budgets and
emits them as one StepPlan; admission starts a prompt past its longest cached prefix.

A decoding request held for its grammar's next mask (RequestState.mask_pending) is left out
of the step; it keeps its pages. Policy only: pages, their reference counts and the prefix
cache are the KVManager's. Budgets count only the tokens a step computes (a cached prefix is
free). Under page pressure the youngest running request is preempted and later recomputed,
on whatever of its pages the cache still holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tgix.engine.kv_manager import KVManager
from tgix.engine.plan import PlanRow, RowKind, StepPlan
from tgix.engine.prefix import PrefixIndex
from tgix.engine.request_state import RequestState, Status
from tgix.engine.speculate import NO_DRAFT, Draft, pause_after, repeats_context


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """TGI's launcher knobs (same names and defaults); see reference §5 for their meaning."""

    max_batch_prefill_tokens: int = 4096
    max_batch_total_tokens: int | None = None  # None -> the pool's capacity
    max_batch_size: int | None = None
    max_waiting_tokens: int = 20
    waiting_served_ratio: float = 0.3
    chunked_prefill: bool = False
    # speculative decoding: a decode-only step of at most speculate_rows rows gives each row
    # the drafts `Scheduler.drafter` proposes, at most `speculate` tokens (0: never)
    speculate: int = 0
    speculate_rows: int = 0

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


class Scheduler:
    """FCFS continuous batching over one KVManager; one step in flight at a time."""

    def __init__(self, config: SchedulerConfig, kv: KVManager):
        self.config = config
        self.kv = kv
        limit = kv.num_pages - 1
        if config.max_batch_total_tokens is not None:
            limit = min(limit, config.max_batch_total_tokens // kv.page_size)
        if limit < 1:
            raise ValueError("max_batch_total_tokens is smaller than one page")
        self.page_limit = limit  # pages running requests may hold together (token budget / pool)
        self._seqs: dict[str, RequestState] = {}  # live requests: waiting or running
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []  # admission order: the last is the victim
        self.prefix = PrefixIndex(kv)  # cached prefixes, pages being computed
        self._waiting_tokens = 1  # TGI's counter: 1 + decode steps since the last admission
        self._inflight: StepPlan | None = None
        self._preemptions = 0
        self._steps = 0
        self.drafter: Callable[[RequestState], Draft] | None = None  # set by the engine

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
            "held_pages": self.kv.num_used,
            "page_limit": self.page_limit,
            "free_pages": self.kv.num_free,
            "cached_pages": self.kv.num_cached,
            "waiting_tokens": self._waiting_tokens,
            "preemptions": self._preemptions,
            "steps": self._steps,
        }

    def add(self, seq: RequestState) -> bool:
        """Queue a request (FCFS). One that can never run is finished at once ("error", False
        returned) so that it cannot block the queue; the server should have refused it."""
        if seq.request_id in self._seqs:
            raise ValueError(f"request {seq.request_id!r} is already queued or running")
        if not seq.prompt_ids or seq.max_new_tokens < 1:
            raise ValueError("need a non-empty prompt and max_new_tokens >= 1")
        # Peak KV: every prompt token plus every generated token but the last (never fed back).
        peak = self.kv.pages_for(len(seq.prompt_ids) + seq.max_new_tokens - 1)
        # Without chunking a prompt is prefilled in one step of the budget; with it, one whose
        # prompt logprobs need it whole runs in a step of its own when it exceeds the budget.
        too_long = (
            not self.config.chunked_prefill
            and len(seq.prompt_ids) > self.config.max_batch_prefill_tokens
        )
        if peak > self.page_limit or too_long:
            seq.status, seq.finish_reason = Status.FINISHED, "error"
            return False
        self._seqs[seq.request_id] = seq
        self._waiting.append(seq)
        return True

    def finish(self, request_id: str, reason: str) -> None:
        """End a request now (EOS, stop sequence, cancel, client gone) and release its pages.
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

    def schedule(self) -> StepPlan | None:
        """The next step's rows, with their pages held; None when there is nothing to run."""
        if self._inflight is not None:
            raise RuntimeError("the previous step has not been reported with on_step_done")
        rows = self._chunked_rows() if self.config.chunked_prefill else self._classic_rows()
        if not rows:
            return None
        self._inflight = StepPlan(tuple(rows))
        self._steps += 1
        return self._inflight

    def on_step_done(self, plan: StepPlan, accepted: Mapping[str, Sequence[int]]) -> list[str]:
        """Record the step: advance KV counts, register pages that are now full in the prefix
        cache, append each producing row's accepted ids, finish requests at max_new_tokens
        ("length"). Returns the ids finished here. Rows of requests finished meanwhile
        (cancelled during the step) are skipped."""
        if plan is not self._inflight:
            raise ValueError("not the step in flight")
        producing = {r.request_id for r in plan.rows if r.produces_token}
        if extra := set(accepted) - producing:
            raise ValueError(f"tokens for rows that produce none: {sorted(extra)}")
        live = [  # rows of requests not finished meanwhile
            r
            for r in plan.rows
            if (s := self._seqs.get(r.request_id)) is not None and s.status is Status.RUNNING
        ]
        if missing := {r.request_id for r in live if r.produces_token} - set(accepted):
            raise ValueError(f"no accepted tokens for {sorted(missing)}")
        self._inflight = None
        finished = []
        for row in live:
            seq = self._seqs[row.request_id]
            seq.num_computed = row.end_pos
            if not row.produces_token:
                self.prefix.register_computed(seq)
                continue
            ids = accepted[row.request_id]
            if row.num_logits > 1 and not row.is_prompt:
                # a verify row: KV counts only for the fed token and the accepted drafts
                seq.num_computed = row.start_pos + len(ids)
            seq.output_ids += ids
            if seq.draft.tokens:  # pages taken for rejected drafts go back
                seq.draft_misses = seq.draft_misses + 1 if len(ids) == 1 else seq.draft_misses // 2
                seq.draft_pause = pause_after(seq.draft_misses)
                seq.draft = NO_DRAFT
                self._shrink(seq, self.kv.pages_for(seq.total_len))
            self.prefix.register_computed(seq)  # after the accepted drafts joined the ids
            seq.prompt_done = True
            if len(seq.output_ids) >= seq.max_new_tokens:
                del seq.output_ids[seq.max_new_tokens :]
                self.finish(seq.request_id, "length")
                finished.append(seq.request_id)
        return finished

    def requeue_all(self) -> None:
        """Preempt every running request and forget every page's content (the device KV was
        lost): they recompute from the front."""
        for seq in reversed(list(self._running)):
            self._preempt(seq)
        self.kv.clear_cache()

    # -- step building ---------------------------------------------------------------------------

    def _classic_rows(self) -> list[PlanRow]:
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
        if not self._running:  # everything preempted: re-admit
            return self._classic_rows()
        self._waiting_tokens += 1
        return self._with_drafts([self._row(s) for s in self._running if not s.mask_pending()])

    def _chunked_rows(self) -> list[PlanRow]:
        """TGI with chunking: decode everyone, continue partial prompts, then admit new
        requests into what is left of the prefill budget (1 token per decode row)."""
        self._grow_for_decode()
        budget = self.config.max_batch_prefill_tokens
        decode = [self._row(s) for s in self._running if s.prompt_done and not s.mask_pending()]
        budget -= sum(len(r.token_ids) for r in decode)
        prompt = []
        for seq in self._running:
            if not seq.prompt_done and budget > 0:
                n = min(seq.total_len - seq.num_computed, budget)
                prompt.append(self._row(seq, n))
                budget -= n
        max_size = self.config.max_batch_size
        if max_size is not None:
            max_size -= len(self._running)
        head = self._waiting[0] if self._waiting else None
        if (  # its logprobs need the whole prompt in one step: alone, the decode rows wait
            not prompt
            and head
            and head.wants_prompt_logprobs
            and head.total_len > budget
            and (alone := self._admit(None, max_size, 1))
        ):
            return [self._row(s, n) for s, n in alone]
        prompt += [self._row(s, n) for s, n in self._admit(None, max_size, budget)]
        return decode + prompt if prompt else self._with_drafts(decode)

    def _admit(
        self, min_size: int | None, max_size: int | None, budget: int
    ) -> list[tuple[RequestState, int]]:
        """TGI's next_batch: take from the queue front while pages and the prefill budget allow
        (head-of-line blocking), each starting past its cached prefix and holding pages for
        its whole current length. Returns (request, first piece length) pairs, now running."""
        if (min_size and len(self._waiting) < min_size) or max_size == 0 or budget <= 0:
            return []
        chunked = self.config.chunked_prefill
        taken: list[tuple[RequestState, int, list[int], list[bytes]]] = []
        tokens, pages_left = 0, self._available()
        admitted_pages: dict[bytes, str] = {}  # pending on requests taken in this loop
        for seq in self._waiting:
            if max_size is not None and len(taken) >= max_size:
                break
            digests = self.prefix.digests(seq)
            cached = self.prefix.lookup(seq, digests)
            if self.prefix.is_pending(digests, len(cached), admitted_pages):
                break  # a running request is computing its next page: hit it next step
            need = self.kv.pages_for(seq.total_len) - len(cached) + self.kv.num_idle(cached)
            if need > pages_left:
                break
            n = seq.total_len - len(cached) * self.kv.page_size  # tokens to compute
            if chunked and not seq.wants_prompt_logprobs:
                n = min(n, budget - tokens)
            # The first request may exceed the budget: only a recompute can (new prompts that do
            # not fit were refused by add), and it must not be starved.
            elif taken and tokens + n > budget:
                break
            taken.append((seq, n, cached, digests))
            admitted_pages.update(dict.fromkeys(digests[len(cached) :], seq.request_id))
            tokens += n
            pages_left -= need
            if tokens >= budget:
                break
        if min_size and len(taken) < min_size:
            return []
        for seq, _, cached, digests in taken:
            self._waiting.popleft()
            seq.status = Status.RUNNING
            self._running.append(seq)
            self.prefix.start(seq, cached, digests)
            self._grow(seq, self.kv.pages_for(seq.total_len))
        return [(seq, n) for seq, n, _, _ in taken]

    def _grow_for_decode(self) -> None:
        """Give each decoding request the page its next token needs, oldest first; when none is
        left, preempt the youngest running request (possibly the one asking)."""
        for seq in list(self._running):
            if seq.status is not Status.RUNNING or not seq.prompt_done:
                continue
            need = self.kv.pages_for(seq.total_len) - len(seq.pages)
            while need > self._available() and seq.status is Status.RUNNING:
                self._preempt(self._running[-1])
            if seq.status is Status.RUNNING:
                self._grow(seq, len(seq.pages) + need)

    def _with_drafts(self, rows: list[PlanRow]) -> list[PlanRow]:
        """Decode rows (a step without prompt rows) with their drafts: each row with one fed
        token gets what `drafter` proposes, up to the pages it holds or can take without
        preempting anyone. Above speculate_rows rows the step is compute-bound on the
        hardware measured (BENCHMARKS.md): no drafts. A row feeding a grammar's forced tokens
        gets none, and above k+1 of them no row does (a verify row holds at most k+1)."""
        if self.drafter is None or not rows or len(rows) > self.config.speculate_rows:
            return rows
        if max(len(r.token_ids) for r in rows) > self.config.speculate + 1:
            return rows
        out = []
        for row in rows:
            seq = self._seqs[row.request_id]
            seq.draft = NO_DRAFT
            if seq.draft_pause > 0:  # its last drafts were rejected (speculate.pause_after)
                seq.draft_pause -= 1
                if not repeats_context(seq):  # unless its text is copying its context
                    out.append(row)
                    continue
            draft = self.drafter(seq) if len(row.token_ids) == 1 else NO_DRAFT
            tokens = draft.tokens
            if tokens:
                need = self.kv.pages_for(row.end_pos + len(tokens))
                if need > len(seq.pages) and need - len(seq.pages) <= self._available():
                    self._grow(seq, need)
                tokens = tokens[: len(seq.pages) * self.kv.page_size - row.end_pos]
            if tokens:
                seq.draft = Draft(tokens, draft.states[: len(tokens) + 1])
                ids = row.token_ids + tokens
                row = replace(row, token_ids=ids, pages=tuple(seq.pages), num_logits=len(ids))
            out.append(row)
        return out

    def _preempt(self, seq: RequestState) -> None:
        """Recompute preemption: drop its pages (full ones stay cached), keep its tokens, put
        it back at the queue front."""
        self._running.remove(seq)
        self._release(seq)
        seq.num_computed, seq.num_cached, seq.prompt_done = 0, 0, False
        seq.draft = NO_DRAFT
        seq.status = Status.WAITING
        self._waiting.appendleft(seq)
        self._preemptions += 1

    # -- pages and rows --------------------------------------------------------------------------

    def _available(self) -> int:
        return min(self.kv.num_available, self.page_limit - self.kv.num_used)

    def _grow(self, seq: RequestState, num_pages: int) -> None:
        extra = num_pages - len(seq.pages)
        if extra > 0:
            seq.pages += self.kv.allocate(extra)

    def _shrink(self, seq: RequestState, num_pages: int) -> None:
        if len(seq.pages) > num_pages:
            self.kv.release(seq.pages[num_pages:])
            del seq.pages[num_pages:]

    def _release(self, seq: RequestState) -> None:
        self.kv.release(seq.pages)
        seq.pages = []
        self.prefix.forget(seq)

    def _row(self, seq: RequestState, n: int = 1) -> PlanRow:
        """A decode row once the prompt is done: every token without KV yet (the last sampled
        one, plus any the engine appended: grammar fast-forward); else the next n tokens of
        the prompt (for a recompute: prompt + generated so far)."""
        start = seq.num_computed
        if seq.prompt_done:
            ids = tuple(seq.output_ids[start - len(seq.prompt_ids) :])
            kind = RowKind.DECODE
        else:
            ids = tuple(seq.all_ids()[start : start + n])
            kind = (
                RowKind.PROMPT
                if start == 0
                else RowKind.CACHED
                if start == seq.num_cached
                else RowKind.CHUNK
            )
        ps = self.kv.page_size
        if start % ps and self.kv.refcount(seq.pages[start // ps]) != 1:  # never: see kv_manager
            raise RuntimeError(f"{seq.request_id}: row would write into a shared page")
        num_logits = 0
        if start + len(ids) == seq.total_len:
            all_logits = kind is RowKind.PROMPT and seq.wants_prompt_logprobs
            num_logits = len(ids) if all_logits and not seq.output_ids else 1
        return PlanRow(seq.request_id, kind, ids, start, tuple(seq.pages), num_logits)
