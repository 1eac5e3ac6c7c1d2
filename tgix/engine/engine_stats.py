"""The engine's counters and the stats it reports (host only): `Engine.stats()`, /metrics.

The engine thread records each dispatch and read-back (host gaps: how long the device sat
idle between a step's results and the next dispatch, 0 for a run-ahead step sent before the
previous one was read) and refreshes the snapshot after each step and while idle: queue and
batch sizes, KV pages and the prefix cache's counters (scheduler and KV manager), the median
host gap, overlapped steps, fast-forwarded grammar tokens, and for an MoE model the expert
load: `expert_<e>_last_step` (assignments routed to expert e in the last step, summed over
layers), `expert_<e>_total` (since start) and `expert_imbalance` (the last step's busiest
expert over the mean). Readers on other threads get the
latest snapshot, a new dict at each refresh.
"""

from __future__ import annotations

import collections

from tgix.engine.scheduler import Scheduler


class EngineStats:
    """Step counters (engine thread) and the last snapshot (`current`, any thread)."""

    def __init__(self):
        self.current: dict[str, float] = {}
        self.overlapped = 0  # steps dispatched before the previous one was read back
        self._host_gaps: collections.deque[float] = collections.deque(maxlen=256)
        self._last_step_done: float | None = None
        self._expert_last: list[int] = []
        self._expert_total: list[int] = []

    def went_idle(self) -> None:
        """Nothing to run: idle time is not a host gap."""
        self._last_step_done = None

    def read_back(self, at: float, expert_load=None) -> None:
        """A step's results arrived at `at`; `expert_load`: its [E] assignments (MoE)."""
        self._last_step_done = at
        if expert_load is not None:
            self._expert_last = [int(n) for n in expert_load]
            total = self._expert_total or [0] * len(self._expert_last)
            self._expert_total = [a + b for a, b in zip(total, self._expert_last, strict=True)]

    def _expert_stats(self) -> dict[str, float]:
        last, stats = self._expert_last, {}
        for e, (n, total) in enumerate(zip(last, self._expert_total, strict=True)):
            stats[f"expert_{e}_last_step"] = n
            stats[f"expert_{e}_total"] = total
        if last:
            mean = sum(last) / len(last)
            stats["expert_imbalance"] = max(last) / mean if mean else 0.0
        return stats

    def dispatched(self, at: float, *, chained: bool) -> None:
        """A step went to the device at `at`; `chained`: fed by the previous step's device
        ids, sent before that step was read (no idle gap)."""
        if chained:
            self._host_gaps.append(0.0)
        elif self._last_step_done is not None:  # device idle from the last results to here
            self._host_gaps.append(at - self._last_step_done)

    def refresh(
        self, scheduler: Scheduler, *, queued: int, page_size: int, fast_forwarded: int
    ) -> None:
        """A new snapshot; `queued`: requests still in the engine's inbox."""
        s, kv = scheduler.stats(), scheduler.kv.stats()
        gaps = sorted(self._host_gaps)
        self.current = {
            "queue_size": s["waiting"] + queued,
            "batch_size": s["running"],
            "batch_max_tokens": s["held_pages"] * page_size,
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
            "overlapped_steps": self.overlapped,
            "fast_forwarded_tokens": fast_forwarded,
            **self._expert_stats(),
        }
