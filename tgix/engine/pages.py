"""Host page allocator for the paged KV cache (no jax): a free list and per-request page lists.

Page 0 is the null page (padding reads and writes it), so it is never handed out. Pages go
back to the free list the moment a request finishes, is cancelled or is preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfPages(RuntimeError):
    """Asked for more pages than are free; callers check `can_allocate` first."""


class PageAllocator:
    """Hands out KV pages of `page_size` tokens from a pool of `num_pages` (page 0 reserved)."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2 or page_size < 1:
            raise ValueError(f"need >= 2 pages of >= 1 token (got {num_pages} x {page_size})")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(1, num_pages))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def capacity_tokens(self) -> int:
        """KV tokens the pool holds (TGI's max_batch_total_tokens), the null page excluded."""
        return (self.num_pages - 1) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        if num_pages > len(self._free):
            raise OutOfPages(f"{num_pages} pages asked, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(num_pages)]
        self._used.update(pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        bad = [p for p in pages if p not in self._used]
        if bad or len(set(pages)) != len(pages):  # validate all first: free nothing on error
            raise ValueError(f"page {(bad or pages)[0]} is not allocated (double free?)")
        for page in pages:
            self._used.remove(page)
            self._free.append(page)

    def stats(self) -> dict[str, int]:
        return {
            "free_pages": self.num_free,
            "used_pages": self.num_used,
            "total_pages": self.num_pages,
            "page_size": self.page_size,
        }
