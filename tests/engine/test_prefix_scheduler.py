"""Scheduler with prefix caching: rows past cached prefixes, every row kind in one plan,
budgets counting computed tokens only, waiting on a prefix being computed, eviction, and
preempted requests resuming on their cached pages. The fake device of test_scheduler keeps
KV in the real pages, so a shared page holding the wrong tokens fails the run."""

from tests.engine.fake_device import alone, tok
from tgix.engine.plan import RowKind

SYSTEM = [tok("system", i) for i in range(16)]  # 4 full pages of 4


def kinds(step) -> list[tuple[str, RowKind, int, int]]:
    return [(r.request_id, r.kind, r.start_pos, len(r.token_ids)) for r in step.rows]


def test_same_prompt_twice_computes_only_the_tail(make):
    dev = make(32, 4, caching=True)
    dev.add("a", 0, 2, prompt=SYSTEM + [1, 2])
    dev.run()
    dev.add("b", 0, 2, prompt=SYSTEM + [1, 2])
    step = dev.sched.schedule()
    assert kinds(step) == [("b", RowKind.CACHED, 16, 2)]
    dev.step(step)
    dev.run()
    assert dev.seqs["b"].output_ids == alone(18, "b", 2)
    assert dev.sched.kv.stats()["prefix_hit_tokens"] == 16


def test_a_whole_cached_prompt_still_computes_its_last_page(make):
    dev = make(32, 4, caching=True)
    dev.add("a", 0, 1, prompt=SYSTEM)
    dev.run()
    dev.add("b", 0, 1, prompt=SYSTEM)  # 16 tokens = 4 full pages: the last is recomputed
    step = dev.sched.schedule()
    assert kinds(step) == [("b", RowKind.CACHED, 12, 4)]
    assert dev.step(step) == ["b"]
    assert dev.seqs["b"].output_ids == alone(16, "b", 1)


def test_identical_prompts_together_wait_one_step_and_share(make):
    dev = make(64, 4, caching=True)
    for rid in ("a", "b", "c"):
        dev.add(rid, 0, 3, prompt=SYSTEM + [7])
    first = dev.sched.schedule()
    assert kinds(first) == [("a", RowKind.PROMPT, 0, 17)]  # b waits: a computes its pages
    dev.step(first)
    second = dev.sched.schedule()
    assert kinds(second) == [("b", RowKind.CACHED, 16, 1), ("c", RowKind.CACHED, 16, 1)]
    shared = set(dev.seqs["a"].pages[:4])
    assert all(set(dev.seqs[r].pages[:4]) == shared for r in "bc")
    assert dev.sched.kv.num_shared == 4  # the prompt's full pages are held once
    dev.step(second)
    dev.run()
    for rid in "abc":
        assert dev.seqs[rid].output_ids == alone(17, rid, 3)


def test_every_row_kind_in_one_plan_and_budget_counts_computed_tokens(make):
    dev = make(128, 4, caching=True, chunked_prefill=True, max_batch_prefill_tokens=12)
    dev.add("base", 0, 1, prompt=SYSTEM)
    dev.run()  # SYSTEM's pages cached
    dev.add("d", 3, 10)
    dev.step()
    dev.step()  # d decodes from here
    dev.add("c", 20, 1)  # a long prompt: an 11-token chunk now, its rest next step
    dev.step()
    dev.add("h", 0, 1, prompt=SYSTEM + [5])  # 16 cached tokens, 1 to compute
    dev.add("n", 2, 1)  # a new prompt: 1 token fits the budget
    step = dev.sched.schedule()
    assert kinds(step) == [
        ("d", RowKind.DECODE, 5, 1),
        ("c", RowKind.CHUNK, 11, 9),
        ("h", RowKind.CACHED, 16, 1),
        ("n", RowKind.PROMPT, 0, 1),
    ]
    assert step.num_tokens == 12  # the budget, spent on computed tokens only
    assert [r.num_logits for r in step.rows] == [1, 1, 1, 0]  # n's chunk stops short
    dev.step(step)
    dev.run()
    assert dev.seqs["h"].output_ids == alone(17, "h", 1)
    assert dev.seqs["c"].output_ids == alone(20, "c", 1)
    assert dev.seqs["n"].output_ids == alone(2, "n", 1)


def test_classic_prefill_budget_counts_only_uncached_tokens(make):
    for caching, expected in ((True, [["a", "b"]]), (False, [["a"], ["b"]])):
        dev = make(64, 4, caching=caching, max_batch_prefill_tokens=12)
        dev.add("w", 0, 1, prompt=SYSTEM[:8] + [3])
        dev.run()
        dev.add("a", 0, 1, prompt=SYSTEM[:8] + [4, 5])  # 10 tokens, 8 cached: computes 2
        dev.add("b", 10, 1)
        steps = []
        while (step := dev.sched.schedule()) is not None:
            steps.append(step.request_ids)
            dev.step(step)
        assert steps == expected


def test_full_cache_evicts_and_keeps_serving(make):
    dev = make(9, 4, caching=True)  # 8 pages
    for i in range(12):  # each leaves 2 full pages cached: the pool is full by the 4th
        dev.add(f"r{i}", 9, 2)
        dev.run()
        assert dev.seqs[f"r{i}"].output_ids == alone(9, f"r{i}", 2)
    kv = dev.sched.kv
    assert kv.num_cached > 0 and kv.stats()["evictions"] > 0


def test_preempted_request_resumes_on_its_cached_pages(make):
    dev = make(7, 2, caching=True, waiting_served_ratio=0.0)  # 6 pages of 2 tokens
    dev.add("r0", 4, 5)  # peak 8 tokens = 4 pages
    dev.add("r1", 4, 5)
    dev.run()
    assert dev.sched.stats()["preemptions"] >= 1
    assert dev.seqs["r0"].output_ids == alone(4, "r0", 5)
    assert dev.seqs["r1"].output_ids == alone(4, "r1", 5)
    # r1 was preempted with 4 prompt + 3 generated tokens; r0's growth then evicted its last
    # cached page (the LRU's first), so the recompute starts past its first 2 pages.
    assert dev.log[-2:] == [[("r1", 3, True)], [("r1", 1, False)]]
    assert dev.sched.kv.stats()["prefix_hit_tokens"] == 4
