"""PageAllocator: null page never handed out, exact counts, double free refused."""

import pytest

from tgix.engine.pages import OutOfPages, PageAllocator


def test_allocate_and_free_round_trip():
    pool = PageAllocator(num_pages=5, page_size=16)
    assert (pool.num_free, pool.capacity_tokens) == (4, 64)
    first = pool.allocate(3)
    assert 0 not in first and len(set(first)) == 3
    assert pool.stats() == {"free_pages": 1, "used_pages": 3, "total_pages": 5, "page_size": 16}
    with pytest.raises(OutOfPages):
        pool.allocate(2)
    pool.free(first)
    assert pool.num_free == 4 and pool.num_used == 0
    assert sorted(pool.allocate(4)) == [1, 2, 3, 4]


def test_pages_for_rounds_up():
    pool = PageAllocator(num_pages=3, page_size=16)
    assert [pool.pages_for(n) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_double_free_and_null_page_refused():
    pool = PageAllocator(num_pages=3, page_size=4)
    pages = pool.allocate(1)
    pool.free(pages)
    with pytest.raises(ValueError, match="double free"):
        pool.free(pages)
    with pytest.raises(ValueError, match="page 0 is not allocated"):
        pool.free([0])
    with pytest.raises(ValueError):
        PageAllocator(num_pages=1, page_size=4)


def test_failed_free_frees_nothing():
    pool = PageAllocator(num_pages=4, page_size=4)
    pages = pool.allocate(2)
    with pytest.raises(ValueError):
        pool.free([pages[0], 3])  # 3 was never handed out
    assert pool.num_used == 2
    pool.free(pages)
