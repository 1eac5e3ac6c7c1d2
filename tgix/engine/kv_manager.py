"""KV page manager (host only, no jax): reference-counted pages, content hashes of full pages,
and an LRU of cached pages that no request holds.

A page is in exactly one of four states:

  free    refcount 0, no content worth keeping (never written, or its hash was dropped)
  cached  refcount 0, holds a full page of known content (its hash is in `_by_hash`); reused
          when a later prompt starts with the same tokens, evicted (least recently released
          first) when the free pages run out
  used    refcount >= 1 (held by that many requests)
  shared  a used page with refcount >= 2 (a prefix several requests read)

so `num_free + num_cached + num_used == num_pages - 1` at all times (page 0, the null page that
padding reads and writes, is never handed out, hashed or shared).

A full page's hash chains the previous page's hash, the page's token ids and the request's
namespace (anything besides tokens that changes KV: an adapter, the KV dtype) and, from a
prompt's first image token on, its images' digest (page_hashes' salt), so a
page is only ever matched as part of the same whole prefix. Stored token ids are compared on a
hit, so a hash collision is a miss, never wrong KV. Only full pages are shared: a request never
writes into a page another request reads (the partial last page of a prompt is recomputed by
whoever needs it, which is copy-on-write by recompute: at most page_size - 1 tokens).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence


class OutOfPages(RuntimeError):
    """Asked for more pages than are free or evictable; callers check `can_allocate` first."""


def page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    namespace: str = "",
    *,
    start: bytes | None = None,
    offset: int = 0,
    salt: tuple[int, str] | None = None,
) -> list[bytes]:
    """Chained content hashes of every full page of `token_ids` (blake2b, 16 bytes each).

    `start` continues a chain (the hash of the page before token_ids[0], which sits at
    position `offset`); None starts one from the namespace. `salt` (position, text) mixes
    text into every page that ends past that position: a prompt's images salt the pages
    from the first image token on, so the text before them stays shared with other
    prompts. Cost: one hash per page, ~1 us.
    """
    parent = start if start is not None else _root(namespace)
    salt_from, salt_bytes = (None, b"") if salt is None else (salt[0], salt[1].encode())
    out = []
    for i in range(len(token_ids) // page_size):
        page = token_ids[i * page_size : (i + 1) * page_size]
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(b"".join(t.to_bytes(4, "little", signed=True) for t in page))
        if salt_from is not None and offset + (i + 1) * page_size > salt_from:
            digest.update(salt_bytes)
        parent = digest.digest()
        out.append(parent)
    return out


def _root(namespace: str) -> bytes:
    return hashlib.blake2b(b"tgix-kv\0" + namespace.encode(), digest_size=16).digest()


class KVManager:
    """Pages of `page_size` tokens from a pool of `num_pages` (page 0 reserved).

    `prefix_caching=False` keeps the refcounts but never matches or keeps content: a released
    page is free at once (today's allocator behaviour, for PREFIX_CACHING=0).
    """

    def __init__(self, num_pages: int, page_size: int, *, prefix_caching: bool = True):
        if num_pages < 2 or page_size < 1:
            raise ValueError(f"need >= 2 pages of >= 1 token (got {num_pages} x {page_size})")
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(1, num_pages))
        self._cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._refs = [0] * num_pages
        self._hash_of: dict[int, bytes] = {}  # page -> content hash (cached or used pages)
        self._tokens_of: dict[int, tuple[int, ...]] = {}  # page -> its token ids (hit check)
        self._by_hash: dict[bytes, int] = {}
        self._shared = 0  # pages with refcount >= 2
        self.hit_tokens = 0  # prompt tokens served from the cache (held after a lookup)
        self.lookup_tokens = 0  # prompt tokens looked up
        self.evictions = 0

    # -- counts ----------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - len(self._free) - len(self._cached)

    @property
    def num_shared(self) -> int:
        return self._shared

    @property
    def num_available(self) -> int:
        """Pages an allocation can take now: free ones, then cached ones (evicted)."""
        return len(self._free) + len(self._cached)

    @property
    def capacity_tokens(self) -> int:
        """KV tokens the pool holds (TGI's max_batch_total_tokens), the null page excluded."""
        return (self.num_pages - 1) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.num_available

    def stats(self) -> dict[str, int | float]:
        looked = self.lookup_tokens
        return {
            "free_pages": self.num_free,
            "cached_pages": self.num_cached,
            "used_pages": self.num_used,
            "shared_pages": self.num_shared,
            "total_pages": self.num_pages,
            "page_size": self.page_size,
            "prefix_hit_tokens": self.hit_tokens,
            "prefix_lookup_tokens": looked,
            "prefix_hit_rate": self.hit_tokens / looked if looked else 0.0,
            "evictions": self.evictions,
        }

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, num_pages: int) -> list[int]:
        """Fresh pages (refcount 1): free ones first, then the least recently released cached
        ones, whose content is forgotten."""
        if num_pages > self.num_available:
            raise OutOfPages(f"{num_pages} pages asked, {self.num_available} available")
        pages = []
        for _ in range(num_pages):
            if self._free:
                page = self._free.popleft()
            else:
                page, _ = self._cached.popitem(last=False)
                self._forget(page)
                self.evictions += 1
            self._refs[page] = 1
            pages.append(page)
        return pages

    def release(self, pages: Iterable[int]) -> None:
        """Drop one reference to each page (a request's whole list, in position order). Pages
        no one holds become cached when their content is known (last page first in the LRU:
        it hashes the longest prefix, so it is the least likely to be asked for again), else
        free."""
        pages = list(pages)
        bad = [p for p in pages if not 0 < p < self.num_pages or self._refs[p] < 1]
        if bad or len(set(pages)) != len(pages):  # validate all first: release nothing on error
            raise ValueError(f"page {(bad or pages)[0]} is not held (double release?)")
        for page in reversed(pages):
            self._refs[page] -= 1
            if self._refs[page] == 1:
                self._shared -= 1
            if self._refs[page] == 0:
                if page in self._hash_of and self.prefix_caching:
                    self._cached[page] = None
                else:
                    self._forget(page)
                    self._free.append(page)

    # -- prefix cache ----------------------------------------------------------------------------

    def lookup(
        self, hashes: Sequence[bytes], token_ids: Sequence[int], max_pages: int
    ) -> list[int]:
        """The longest run of cached or used pages holding the first full pages of token_ids
        (`hashes` = page_hashes(token_ids)), at most `max_pages`. Changes nothing."""
        if not self.prefix_caching:
            return []
        ps, found = self.page_size, []
        for i, digest in enumerate(hashes[:max_pages]):
            page = self._by_hash.get(digest)
            if page is None or self._tokens_of[page] != tuple(token_ids[i * ps : (i + 1) * ps]):
                break
            found.append(page)
        return found

    def num_idle(self, pages: Iterable[int]) -> int:
        """How many of these pages are cached but unheld (holding them uses up available
        pages, holding used ones does not)."""
        return sum(1 for p in pages if self._refs[p] == 0)

    def hold(self, pages: Sequence[int], *, looked_up_tokens: int) -> None:
        """Take one reference to each page `lookup` found for a prompt of `looked_up_tokens`
        tokens (hit-rate counters: the pages' tokens hit, the prompt's looked up)."""
        for page in pages:
            if self._refs[page] == 0:
                del self._cached[page]
            elif self._refs[page] == 1:
                self._shared += 1
            self._refs[page] += 1
        self.lookup_tokens += looked_up_tokens
        self.hit_tokens += len(pages) * self.page_size

    def register(self, page: int, digest: bytes, token_ids: Sequence[int]) -> None:
        """Record that a held page now holds a full page of known content. A digest already
        owned by another page keeps that page (two requests computed the same prefix at
        once); this one stays unhashed and is freed on release."""
        if not self.prefix_caching or page in self._hash_of or digest in self._by_hash:
            return
        if self._refs[page] < 1 or len(token_ids) != self.page_size:
            raise ValueError(f"page {page} is not held, or not full")
        self._hash_of[page] = digest
        self._tokens_of[page] = tuple(token_ids)
        self._by_hash[digest] = page

    def clear_cache(self) -> None:
        """Forget every page's content (the device KV was lost or reset): cached pages free."""
        while self._cached:
            page, _ = self._cached.popitem(last=False)
            self._free.append(page)
        for page in list(self._hash_of):
            self._forget(page)

    def _forget(self, page: int) -> None:
        digest = self._hash_of.pop(page, None)
        if digest is not None:
            del self._by_hash[digest]
            del self._tokens_of[page]
