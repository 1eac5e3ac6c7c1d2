"""Data parallelism inside one process: several engines, one per replica of the weights.

Each replica is a whole Engine (its own thread, scheduler, KV pages and executables) on its
own (1, model) slice of the mesh's "data" axis; `Replicas` looks like one Engine to the
server and sends each request to the least busy replica (queued + running, ties taken in
turn, so a burst spreads evenly before the replicas' stats catch up). Replicas share nothing
on the device, so their steps run concurrently on their own devices: the throughput of
`data` independent servers behind one endpoint, for models small enough that tensor
parallelism would spend more on collectives than it saves (host only: no jax import).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tgix.engine.request import GenerationRequest
from tgix.engine.stream import RequestStream

# stats that add up over replicas; the rest are taken from the busiest (worst) replica
_SUMMED = (
    "queue_size",
    "batch_size",
    "batch_max_tokens",
    "free_pages",
    "used_pages",
    "cached_pages",
    "shared_pages",
    "prefix_hit_tokens",
    "prefix_lookup_tokens",
    "prefix_evictions",
    "preemptions",
    "steps",
    "overlapped_steps",
    "fast_forwarded_tokens",
)


class Replicas:
    """One Engine's interface over `engines` (replica 0 owns the grammar compiler)."""

    def __init__(self, engines: Sequence):
        if not engines:
            raise ValueError("Replicas needs at least one engine")
        self.engines = list(engines)
        first = self.engines[0]
        self.tokenizer = first.tokenizer
        self.limits = first.limits  # per replica: each holds its own KV budget
        self.model_id = first.model_id
        self.grammar_compiler = first.grammar_compiler
        self.vision = getattr(first, "vision", None)  # host embeddings: any replica takes them
        self.speculate = first.speculate
        self.quantize = getattr(first, "quantize", None)
        self.kv_dtype = getattr(first, "kv_dtype", None)
        self._turn = itertools.count()

    def _load(self, engine) -> float:
        stats = engine.stats()
        return stats.get("queue_size", 0) + stats.get("batch_size", 0)

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue on the least busy replica; its stream cancels on that replica."""
        loads = [self._load(engine) for engine in self.engines]
        idlest = [e for e, load in zip(self.engines, loads, strict=True) if load == min(loads)]
        return idlest[next(self._turn) % len(idlest)].submit(request)

    def cancel(self, request_id: str) -> None:
        for engine in self.engines:
            engine.cancel(request_id)

    def healthy(self) -> bool:
        return all(engine.healthy() for engine in self.engines)

    def stats(self) -> dict[str, float]:
        each = [engine.stats() for engine in self.engines]
        merged: dict[str, float] = {}
        for stats in each:
            for key, value in stats.items():
                if key in _SUMMED:
                    merged[key] = merged.get(key, 0) + value
                else:
                    merged[key] = max(merged.get(key, value), value)
        merged["replicas"] = len(self.engines)
        return merged

    def shutdown(self, timeout_s: float = 30.0) -> None:
        for engine in self.engines:
            engine.shutdown(timeout_s)
