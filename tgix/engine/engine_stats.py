"""The engine's counters and the stats it reports (host only): `Engine.stats()`, /metrics.

The engine thread records each dispatch and read-back (host gaps: how long the device sat
idle between a step's results and the next dispatch, 0 for a run-ahead step sent before the
previous one was read) and refreshes the snapshot after each step and while idle: queue and
batch sizes, KV pages and the prefix cache's counters (scheduler and KV manager), the median
host gap, overlapped steps, fast-forwarded grammar tokens. Readers on other threads get the
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

    def went_idle(self) -> None:
        """Nothing to run: idle time is not a host gap."""
        self._last_step_done = None

    def read_back(self, at: float) -> None:
        self._last_step_done = at

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
        }
