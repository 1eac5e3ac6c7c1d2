"""KVManager: refcounts, content hashes, LRU of cached pages, collision safety, invariants."""

import random

import pytest

from tgix.engine.kv_manager import KVManager, OutOfPages, page_hashes


def check(kv: KVManager) -> None:
    assert kv.num_free + kv.num_cached + kv.num_used == kv.num_pages - 1
    assert kv.refcount(0) == 0
    assert kv.num_shared == sum(kv.refcount(p) >= 2 for p in range(kv.num_pages))


def filled(kv: KVManager, ids: list[int], namespace: str = "") -> list[int]:
    """Allocate pages for ids and register each full page (as a step that computed them)."""
    pages = kv.allocate(kv.pages_for(len(ids)))
    ps = kv.page_size
    for i, digest in enumerate(page_hashes(ids, ps, namespace)):
        kv.register(pages[i], digest, ids[i * ps : (i + 1) * ps])
    return pages


def test_allocate_release_round_trip_and_null_page():
    kv = KVManager(num_pages=5, page_size=16)
    assert (kv.num_free, kv.capacity_tokens) == (4, 64)
    first = kv.allocate(3)
    assert 0 not in first and len(set(first)) == 3 and kv.num_used == 3
    with pytest.raises(OutOfPages):
        kv.allocate(2)
    kv.release(first)
    assert (kv.num_free, kv.num_cached, kv.num_used) == (4, 0, 0)  # unhashed: free at once
    assert sorted(kv.allocate(4)) == [1, 2, 3, 4]
    check(kv)


def test_double_release_and_null_page_refused():
    kv = KVManager(num_pages=3, page_size=4)
    pages = kv.allocate(1)
    kv.release(pages)
    for bad in (pages, [0], [1, 1]):
        with pytest.raises(ValueError, match="not held"):
            kv.release(bad)
    check(kv)


def test_hit_shares_pages_and_release_caches_them():
    kv = KVManager(num_pages=9, page_size=4)
    ids = list(range(10))  # 2 full pages + 2 tokens
    a = filled(kv, ids)
    digests = page_hashes(ids, 4)
    assert len(digests) == 2
    hit = kv.lookup(digests, ids, max_pages=2)
    assert hit == a[:2]
    kv.hold(hit, looked_up_tokens=10)
    assert [kv.refcount(p) for p in a] == [2, 2, 1] and kv.num_shared == 2
    assert kv.stats()["prefix_hit_rate"] == 8 / 10
    kv.release(a)
    assert (kv.num_used, kv.num_shared, kv.num_free) == (2, 0, 6)  # a's partial page: free
    kv.release(hit)
    assert (kv.num_cached, kv.num_used) == (2, 0)
    assert kv.lookup(digests, ids, 2) == a[:2]  # still there, unheld
    assert kv.lookup(digests, ids, 1) == a[:1]  # the cap holds
    check(kv)


def test_lookup_stops_at_first_miss_and_checks_tokens():
    kv = KVManager(num_pages=9, page_size=2)
    ids = [1, 2, 3, 4, 5, 6]
    pages = filled(kv, ids)
    other = [1, 2, 9, 9, 5, 6]  # page 2 differs: the chain makes page 3 differ too
    assert kv.lookup(page_hashes(other, 2), other, 3) == pages[:1]
    # a forced collision (same digest, other tokens) is a miss, never wrong KV
    forged = [7, 7, 3, 4]
    assert kv.lookup(page_hashes(ids, 2)[:2], forged, 2) == []
    kv.release(pages)
    check(kv)


def test_namespaces_never_share():
    kv = KVManager(num_pages=9, page_size=2)
    ids = [1, 2, 3, 4]
    pages = filled(kv, ids, namespace="adapter-a")
    assert page_hashes(ids, 2, "adapter-a") != page_hashes(ids, 2, "adapter-b")
    assert kv.lookup(page_hashes(ids, 2, "adapter-b"), ids, 2) == []
    assert kv.lookup(page_hashes(ids, 2, "adapter-a"), ids, 2) == pages
    kv.release(pages)


def test_lru_evicts_least_recent_and_a_requests_last_page_first():
    kv = KVManager(num_pages=5, page_size=2)  # 4 pages
    old = filled(kv, [1, 2, 3, 4])
    kv.release(old)
    new = filled(kv, [5, 6, 7, 8])
    kv.release(new)
    assert kv.num_cached == 4 and kv.num_free == 0
    # released in reverse: old's last page is the least recent of all
    assert kv.allocate(1) == [old[1]]
    assert kv.lookup(page_hashes([1, 2, 3, 4], 2), [1, 2, 3, 4], 2) == old[:1]
    assert kv.allocate(2) == [old[0], new[1]]
    assert kv.stats()["evictions"] == 3
    check(kv)


def test_duplicate_content_keeps_the_first_page():
    kv = KVManager(num_pages=9, page_size=2)
    a, b = filled(kv, [1, 2]), filled(kv, [1, 2])  # two requests computed it at once
    assert kv.lookup(page_hashes([1, 2], 2), [1, 2], 1) == a
    kv.release(b)
    kv.release(a)
    assert (kv.num_cached, kv.num_free) == (1, 7)
    check(kv)


def test_caching_off_frees_at_once_and_never_matches():
    kv = KVManager(num_pages=5, page_size=2, prefix_caching=False)
    pages = filled(kv, [1, 2, 3, 4])
    assert kv.lookup(page_hashes([1, 2, 3, 4], 2), [1, 2, 3, 4], 2) == []
    kv.release(pages)
    assert (kv.num_free, kv.num_cached) == (4, 0)


def test_clear_cache_forgets_everything():
    kv = KVManager(num_pages=5, page_size=2)
    kv.release(filled(kv, [1, 2, 3, 4]))
    kv.clear_cache()
    assert (kv.num_free, kv.num_cached) == (4, 0)
    assert kv.lookup(page_hashes([1, 2, 3, 4], 2), [1, 2, 3, 4], 2) == []


def test_random_workload_keeps_the_invariants():
    rng = random.Random(0)
    kv = KVManager(num_pages=33, page_size=2)
    held: list[list[int]] = []
    prompts = [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(20)]
    for _ in range(2000):
        if held and (rng.random() < 0.45 or not kv.can_allocate(6)):
            kv.release(held.pop(rng.randrange(len(held))))
        else:
            ids = rng.choice(prompts)
            digests = page_hashes(ids, 2)
            hit = kv.lookup(digests, ids, (len(ids) - 1) // 2)
            kv.hold(hit, looked_up_tokens=len(ids))
            rest = kv.allocate(kv.pages_for(len(ids)) - len(hit))
            pages = hit + rest
            for i in range(len(hit), len(digests)):
                kv.register(pages[i], digests[i], ids[2 * i : 2 * i + 2])
            held.append(pages)
        check(kv)
    for pages in held:
        kv.release(pages)
    assert kv.num_used == 0 and kv.stats()["prefix_hit_tokens"] > 0
    check(kv)
