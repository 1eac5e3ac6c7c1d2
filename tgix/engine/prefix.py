"""Prefix-cache bookkeeping for the scheduler (host only): which cached pages a waiting request
can start past, which full pages running requests are still computing, and registering pages
in the KVManager as soon as a step has filled them.

A waiting request whose next uncached page is being computed by a running request waits
rather than computing it too (identical prompts queued together, `best_of` sub-requests, a
shared system prompt arriving in a burst): the page is registered when that step is committed,
usually one step later, and the waiting request then starts past it.
"""

from __future__ import annotations

from tgix.engine.kv_manager import KVManager, page_hashes
from tgix.engine.request_state import RequestState


class PrefixIndex:
    """The scheduler's view of the prefix cache over one KVManager."""

    def __init__(self, kv: KVManager):
        self.kv = kv
        self._pending: dict[bytes, str] = {}  # digest of a page being computed -> request id

    def digests(self, seq: RequestState) -> list[bytes]:
        """Chained hashes of the full pages of what the request must prefill (prompt, plus the
        generated ids of a preempted request); none when it may not read the cache."""
        if not (self.kv.prefix_caching and seq.read_cache):
            return []
        length, digests = seq.lookup_digests
        if length != seq.total_len:
            digests = page_hashes(
                seq.all_ids(), self.kv.page_size, seq.namespace, salt=seq.image_salt
            )
            seq.lookup_digests = (seq.total_len, digests)
        return digests

    def lookup(self, seq: RequestState, digests: list[bytes]) -> list[int]:
        """The cached pages the request can start past: full pages only, leaving at least one
        token to compute (its logits give the next token)."""
        cap = (seq.total_len - 1) // self.kv.page_size
        return self.kv.lookup(digests, seq.all_ids(), cap)

    def is_pending(self, digests: list[bytes], num_cached: int, extra: dict[bytes, str]) -> bool:
        """The first page after the cached ones is being computed (by a running request, or by
        one admitted earlier in the same step: `extra`)."""
        if num_cached >= len(digests):
            return False
        return digests[num_cached] in self._pending or digests[num_cached] in extra

    def start(self, seq: RequestState, cached: list[int], digests: list[bytes]) -> None:
        """Admission: hold the cached pages as the request's first pages; the rest of its full
        pages are now pending on it."""
        self.kv.hold(cached, looked_up_tokens=seq.total_len if seq.read_cache else 0)
        seq.pages = list(cached)
        seq.num_computed = seq.num_cached = len(cached) * self.kv.page_size
        seq.page_digests = digests[: len(cached)]
        self._pending.update(dict.fromkeys(digests[len(cached) :], seq.request_id))

    def forget(self, seq: RequestState) -> None:
        """The request released its pages (finished or preempted): nothing is pending on it."""
        seq.page_digests = []
        for digest in [d for d, owner in self._pending.items() if owner == seq.request_id]:
            del self._pending[digest]

    def register_computed(self, seq: RequestState) -> None:
        """Hash each page a step filled (prompt or generated tokens) into the cache."""
        if not self.kv.prefix_caching:
            return
        ps, ids = self.kv.page_size, None
        for i in range(len(seq.page_digests), seq.num_computed // ps):
            ids = ids or seq.all_ids()
            page_ids = ids[i * ps : (i + 1) * ps]
            if min(page_ids) < 0:  # a placeholder (run-ahead): registered once it is known
                return
            parent = seq.page_digests[-1] if seq.page_digests else None
            (digest,) = page_hashes(
                page_ids, ps, seq.namespace, start=parent, offset=i * ps, salt=seq.image_salt
            )
            seq.page_digests.append(digest)
            self.kv.register(seq.pages[i], digest, page_ids)
            if self._pending.get(digest) == seq.request_id:
                del self._pending[digest]
