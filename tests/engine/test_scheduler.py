"""Scheduler: every knob with exact steps, tokens and pages, against a fake device that keeps
KV in the real pages (so shared or missing pages corrupt what a row reads back)."""

import random

import pytest

from tests.engine.fake_device import alone
from tgix.attention.pack import pack_step
from tgix.engine.kv_manager import KVManager
from tgix.engine.request_state import Status
from tgix.engine.scheduler import Scheduler, SchedulerConfig


def test_config_validation():
    for bad in (
        {"max_batch_prefill_tokens": 0},
        {"max_batch_total_tokens": 0},
        {"max_batch_size": 0},
        {"max_waiting_tokens": -1},
        {"waiting_served_ratio": -0.1},
        {"waiting_served_ratio": float("nan")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SchedulerConfig(**bad)
    with pytest.raises(ValueError, match="one page"):
        Scheduler(SchedulerConfig(max_batch_total_tokens=15), KVManager(4, 16))


def test_max_new_tokens_finishes_with_length_and_rows_pack(make):
    dev = make(9, 4)
    seq = dev.add("a", 5, 3)
    step = dev.sched.schedule()
    (row,) = step.rows
    assert (row.start_pos, row.token_ids, row.is_prompt, row.produces_token) == (
        0,
        tuple(seq.prompt_ids),
        True,
        True,
    )
    assert row.pages == (1, 2) and dev.sched.stats()["held_pages"] == 2
    arrays = pack_step(step.rows, page_size=4, num_tokens=8, num_rows=2, pages_per_row=4)
    assert arrays["slot_mapping"][:5].tolist() == [4, 5, 6, 7, 8]
    assert dev.step(step) == []
    assert dev.step() == []  # decode at position 5 (page 2)
    assert dev.step() == ["a"]  # decode at 6, third token
    assert (seq.output_ids, seq.finish_reason) == (alone(5, "a", 3), "length")
    assert seq.status is Status.FINISHED
    assert dev.log[1:] == [[("a", 1, False)]] * 2
    assert dev.sched.schedule() is None and dev.sched.stats()["held_pages"] == 0


def test_classic_prefill_budget_fcfs_head_of_line(make):
    dev = make(64, 4, max_batch_prefill_tokens=10)
    for rid, n in (("r0", 4), ("r1", 4), ("r2", 4), ("r3", 1)):
        dev.add(rid, n, 2)
    dev.step()
    # r0 + r1 = 8 fit; r2 would make 12 > 10 so the loop stops there and r3 (1 token) waits too.
    assert dev.log[0] == [("r0", 4, True), ("r1", 4, True)]
    assert dev.sched.num_waiting == 2
    dev.run()
    # running 2 * 0.3 -> min_size 0: r2 + r3 (5 tokens) are prefilled next, alone.
    assert dev.log[1:] == [
        [("r2", 4, True), ("r3", 1, True)],
        [("r0", 1, False), ("r1", 1, False), ("r2", 1, False), ("r3", 1, False)],
    ]
    for rid, n in (("r0", 4), ("r1", 4), ("r2", 4), ("r3", 1)):
        assert dev.seqs[rid].output_ids == alone(n, rid, 2)


def test_classic_prompt_over_prefill_budget_is_an_error(make):
    dev = make(64, 4, max_batch_prefill_tokens=10)
    seq = dev.add("big", 11, 1)
    assert (seq.status, seq.finish_reason, dev.sched.num_waiting) == (Status.FINISHED, "error", 0)
    assert dev.sched.schedule() is None


def test_chunked_prefill_splits_long_prompt_with_exact_chunks(make):
    dev = make(64, 4, max_batch_prefill_tokens=8, chunked_prefill=True)
    dev.add("a", 3, 6)
    dev.add("b", 20, 2)
    dev.run()
    assert dev.log == [
        [("a", 3, True), ("b", 5, True)],
        [("a", 1, False), ("b", 7, True)],  # decode rows first, 1 budget token each
        [("a", 1, False), ("b", 7, True)],
        [("a", 1, False), ("b", 1, True)],  # 5 + 7 + 7 + 1 = 20: b's first token
        [("a", 1, False), ("b", 1, False)],  # b done (2 tokens)
        [("a", 1, False)],
    ]
    assert dev.seqs["a"].output_ids == alone(3, "a", 6)
    assert dev.seqs["b"].output_ids == alone(20, "b", 2)


def test_chunked_partial_prefill_rows_produce_no_token(make):
    dev = make(64, 4, max_batch_prefill_tokens=4, chunked_prefill=True)
    dev.add("a", 6, 1)
    step = dev.sched.schedule()
    assert [(r.start_pos, r.produces_token) for r in step.rows] == [(0, False)]
    with pytest.raises(ValueError, match="produce none"):
        dev.sched.on_step_done(step, {"a": [1]})
    assert dev.step(step) == []
    assert dev.step() == ["a"]
    assert dev.log == [[("a", 4, True)], [("a", 2, True)]]


def test_total_token_budget_below_pool(make):
    dev = make(101, 4, max_batch_total_tokens=18)  # 4 pages of the 100
    assert dev.sched.page_limit == 4
    dev.add("r0", 8, 1)
    dev.add("r1", 8, 1)
    dev.add("r2", 5, 1)
    step = dev.sched.schedule()
    assert step.request_ids == ["r0", "r1"]  # r2 needs 2 more pages than the budget leaves
    assert (dev.sched.stats()["held_pages"], dev.sched.kv.num_free) == (4, 96)
    assert dev.step(step) == ["r0", "r1"]
    dev.run()
    assert dev.log[1:] == [[("r2", 5, True)]]
    # Peak 8 + 12 - 1 = 19 tokens needs 5 pages > 4: refused, though the pool has 100.
    assert dev.add("r3", 8, 12).finish_reason == "error"


def test_classic_max_batch_size(make):
    dev = make(64, 4, max_batch_size=2, waiting_served_ratio=0.0)
    dev.add("r0", 2, 2)
    dev.add("r1", 2, 4)
    dev.add("r2", 2, 1)
    dev.run()
    assert dev.log == [
        [("r0", 2, True), ("r1", 2, True)],
        [("r0", 1, False), ("r1", 1, False)],  # max_size 0: r2 waits; r0 done
        [("r2", 2, True)],  # done at once
        [("r1", 1, False)],
        [("r1", 1, False)],
    ]


def test_chunked_max_batch_size_caps_rows(make):
    dev = make(64, 4, max_batch_size=2, chunked_prefill=True)
    for rid in ("r0", "r1", "r2"):
        dev.add(rid, 2, 2)
    dev.run()
    assert dev.log == [
        [("r0", 2, True), ("r1", 2, True)],
        [("r0", 1, False), ("r1", 1, False)],
        [("r2", 2, True)],
        [("r2", 1, False)],
    ]


def test_max_waiting_tokens_forces_admission(make):
    # ratio 2: one running needs 2 admissible waiting; a single one waits for max_waiting_tokens.
    dev = make(64, 4, max_waiting_tokens=4, waiting_served_ratio=2.0)
    dev.add("r0", 2, 10)
    dev.step()
    dev.add("r1", 2, 3)
    for _ in range(3):  # waiting_tokens 1, 2, 3 < 4: decode only
        dev.step()
    assert dev.sched.stats()["waiting_tokens"] == 4 and dev.sched.num_waiting == 1
    dev.step()  # TGI: after max_waiting_tokens - 1 decodes since the last admission
    assert dev.log[1:] == [[("r0", 1, False)]] * 3 + [[("r1", 2, True)]]
    assert dev.sched.stats()["waiting_tokens"] == 1
    dev.run()
    assert dev.seqs["r0"].output_ids == alone(2, "r0", 10)
    assert dev.seqs["r1"].output_ids == alone(2, "r1", 3)


def test_waiting_served_ratio_needs_floor_share_admissible(make):
    dev = make(256, 4, max_batch_prefill_tokens=40, max_waiting_tokens=100)
    for i in range(10):
        dev.add(f"r{i}", 4, 20)
    dev.step()
    assert dev.sched.num_running == 10
    dev.add("w0", 15, 1)
    dev.add("w1", 15, 1)
    dev.add("w2", 15, 1)  # 3 waiting, but 45 > 40: only 2 admissible at once -> none
    dev.step()
    assert dev.log[-1] == [(f"r{i}", 1, False) for i in range(10)]
    dev.sched.finish("w2", "cancelled")
    dev.step()  # floor(10 * 0.3) = 3 > 2 waiting
    assert len(dev.log[-1]) == 10 and dev.sched.num_waiting == 2
    dev.add("w3", 5, 1)
    dev.step()
    assert dev.log[-1] == [("w0", 15, True), ("w1", 15, True), ("w3", 5, True)]
    for i in range(10):
        dev.sched.finish(f"r{i}", "cancelled")
    assert dev.sched.schedule() is None


def test_head_of_line_blocks_on_pages(make):
    dev = make(5, 4)  # 4 pages
    dev.add("a", 8, 5)  # 2 pages now, up to 3
    dev.step()
    dev.add("big", 9, 1)  # 3 pages: only 2 free
    dev.add("small", 1, 1)  # would fit, but must not jump the queue
    step = dev.sched.schedule()
    assert step.request_ids == ["a"] and dev.sched.num_waiting == 2
    dev.step(step)
    dev.run()
    assert [r[0][0] for r in dev.log] == ["a", "a", "a", "a", "a", "big"]
    assert dev.log[-1] == [("big", 9, True), ("small", 1, True)]


def test_cancel_waiting_and_running_frees_pages(make):
    dev = make(9, 4, max_batch_size=1)
    dev.add("run", 6, 10)
    dev.add("wait", 6, 10)
    dev.step()
    pool = dev.sched.kv
    assert (pool.num_free, dev.sched.num_running, dev.sched.num_waiting) == (6, 1, 1)
    dev.sched.finish("wait", "cancelled")
    dev.sched.finish("wait", "cancelled")  # idempotent
    assert (pool.num_free, dev.sched.num_waiting) == (6, 0)
    step = dev.sched.schedule()
    dev.sched.finish("run", "cancelled")  # while its step is in flight
    assert pool.num_free == 8
    assert dev.sched.on_step_done(step, {"run": [7]}) == []  # its token is ignored
    assert dev.seqs["run"].output_ids == alone(6, "run", 1)
    assert [dev.seqs[r].finish_reason for r in ("run", "wait")] == ["cancelled"] * 2
    assert dev.sched.schedule() is None


def test_preemption_recomputes_and_matches_alone(make):
    dev = make(5, 2, waiting_served_ratio=0.0)  # 4 pages of 2 tokens
    dev.add("r0", 3, 4)  # peak 3 + 4 - 1 = 6 tokens = 3 pages: fits alone
    dev.add("r1", 3, 4)
    dev.run()
    assert dev.log == [
        [("r0", 3, True), ("r1", 3, True)],
        [("r0", 1, False), ("r1", 1, False)],
        [("r0", 1, False)],  # r0 needs a 3rd page: r1 (youngest) preempted
        [("r0", 1, False)],  # r1 needs 3 pages, 1 free
        [("r1", 5, True)],  # recompute: prompt + its 2 tokens, then its 3rd token
        [("r1", 1, False)],
    ]
    assert dev.sched.stats()["preemptions"] == 1
    assert dev.seqs["r0"].output_ids == alone(3, "r0", 4)
    assert dev.seqs["r1"].output_ids == alone(3, "r1", 4)


def test_too_large_for_pool_errors_without_blocking(make):
    dev = make(5, 4, chunked_prefill=True)  # 16 tokens
    big = dev.add("big", 10, 8)  # peak 17
    dev.add("ok", 10, 7)  # peak 16
    assert (big.status, big.finish_reason) == (Status.FINISHED, "error")
    dev.run()
    assert dev.seqs["ok"].output_ids == alone(10, "ok", 7)


def test_step_protocol_errors(make):
    dev = make(9, 4)
    dev.add("a", 2, 2)
    with pytest.raises(ValueError, match="already"):
        dev.add("a", 2, 2)
    with pytest.raises(ValueError, match="non-empty"):
        dev.add("b", 0, 2)
    step = dev.sched.schedule()
    with pytest.raises(RuntimeError, match="on_step_done"):
        dev.sched.schedule()
    with pytest.raises(ValueError, match="no accepted tokens"):
        dev.sched.on_step_done(step, {})
    dev.step(step)
    with pytest.raises(ValueError, match="in flight"):
        dev.sched.on_step_done(step, {"a": [1]})
    dev.run()


@pytest.mark.parametrize("chunked", [False, True])
def test_random_load_under_page_pressure_matches_alone(make, chunked):
    rng = random.Random(0)
    dev = make(
        13, 4, max_batch_prefill_tokens=24, max_batch_size=6, chunked_prefill=chunked
    )  # 48 tokens of KV
    specs = {f"r{i}": (rng.randint(1, 20), rng.randint(1, 24)) for i in range(30)}
    pending = list(specs.items())
    for _ in range(2000):
        if pending and rng.random() < 0.3:
            rid, (n, m) = pending.pop(0)
            dev.add(rid, n, m)
        step = dev.sched.schedule()
        if step is None:
            if not pending:
                break
            continue
        dev.step(step)
        if step.rows and rng.random() < 0.02:  # an EOS decided by the caller
            rid = step.rows[0].request_id
            dev.sched.finish(rid, "eos_token")
            specs[rid] = (specs[rid][0], len(dev.seqs[rid].output_ids))
    assert not pending and dev.sched.num_waiting == dev.sched.num_running == 0
    for rid, (n, m) in specs.items():
        seq = dev.seqs[rid]
        assert seq.status is Status.FINISHED
        if seq.finish_reason != "error":
            assert seq.output_ids == alone(n, rid, m)
    assert dev.sched.stats()["preemptions"] > 0


def test_failed_step_errors_its_rows_and_frees_pages(make):
    """TGI: a failed forward errors every request in it; the caller finishes them, then reports
    the step with no tokens so scheduling can go on."""
    dev = make(9, 4)
    dev.add("a", 5, 4)
    dev.add("b", 3, 4)
    step = dev.sched.schedule()
    for rid in step.request_ids:
        dev.sched.finish(rid, "error")
    assert dev.sched.on_step_done(step, {}) == []
    assert dev.sched.kv.num_free == 8 and dev.sched.schedule() is None
    assert [dev.seqs[r].output_ids for r in ("a", "b")] == [[], []]


def test_host_modules_do_not_import_jax():
    import subprocess
    import sys

    code = (
        "import sys, tgix.engine.scheduler, tgix.engine.kv_manager, tgix.engine.prefix, "
        "tgix.engine.plan, "
        "tgix.engine.request_state, tgix.engine.runahead, tgix.engine.commit, "
        "tgix.engine.batch, tgix.attention.pack; "
        "sys.exit(int('jax' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_draft_pages_are_taken_for_the_step_and_given_back_after_it(make):
    """A decode row with drafts gets the pages its k+1 tokens need (without preempting
    anyone); after the step, KV counts the fed token and the accepted drafts only, and the
    pages beyond what the sequence now needs go back to the pool."""
    from tgix.engine.speculate import Draft

    dev = make(num_pages=16, page_size=4, speculate=3, speculate_rows=4)
    dev.sched.drafter = lambda seq: Draft((11, 12, 13))
    seq = dev.add("a", 6, 10)
    dev.step()  # the prompt: 6 tokens, then one sampled
    assert (len(seq.pages), seq.num_computed, len(seq.output_ids)) == (2, 6, 1)
    step = dev.sched.schedule()
    (row,) = step.rows
    assert (row.token_ids[1:], row.num_logits, row.start_pos) == ((11, 12, 13), 4, 6)
    assert len(seq.pages) == 3 == len(row.pages)  # positions 6..9
    dev.sched.on_step_done(step, {"a": [11, 99]})  # the first draft kept, then 99
    assert (seq.output_ids[1:], seq.num_computed, len(seq.pages)) == ([11, 99], 8, 3)
    step = dev.sched.schedule()
    dev.sched.on_step_done(step, {"a": [5]})  # every draft rejected: 5 replaces the first (11)
    assert (seq.num_computed, seq.total_len, len(seq.pages)) == (9, 10, 3)
    assert seq.output_ids[1:] == [11, 99, 5]
    assert (seq.draft_misses, seq.draft_pause) == (1, 1)  # it sits the next step out
    (row,) = dev.sched.schedule().rows
    assert (row.token_ids, row.num_logits, seq.draft_pause) == ((5,), 1, 0)
    dev.sched.finish("a", None)  # (the fake device holds no KV for the unrecorded steps)


def test_a_paused_row_drafts_anyway_while_its_text_repeats_its_context(make):
    """After a verify step that kept no draft the row sits steps out (pause_after), unless
    its last three ids occurred earlier in its prompt + output (it is copying: a quote, a
    rewritten file; what prompt lookup needs to draft at all)."""
    from tgix.engine.speculate import Draft, repeats_context

    dev = make(num_pages=16, page_size=4, speculate=3, speculate_rows=4)
    dev.sched.drafter = lambda seq: Draft((11, 12, 13))
    for rid, first, rejected, copying in (("a", 50, 51, False), ("b", 41, 42, True)):
        seq = dev.add(rid, 6, 12, prompt=[7, 41, 42, 43, 44, 7])
        dev.step()
        seq.output_ids[-1] = first  # the prompt's sampled token, set for the test
        step = dev.sched.schedule()
        assert step.rows[0].num_logits == 4
        dev.sched.on_step_done(step, {rid: [rejected]})  # every draft rejected
        assert seq.draft_pause == 1
        # "7 50 51" never occurred before; "7 41 42" opens the prompt
        assert repeats_context(seq) is copying
        step = dev.sched.schedule()
        (row,) = step.rows
        assert (row.num_logits, seq.draft_pause) == ((4 if copying else 1), 0)
        assert row.token_ids[1:] == ((11, 12, 13) if copying else ())
        dev.sched.on_step_done(step, {rid: [7]})
        dev.sched.finish(rid, None)


def test_chunked_prompt_logprobs_over_the_budget_run_whole_in_a_step_alone(make):
    """Prompt logprobs need every prompt token in one step: with chunking such a prompt
    longer than the budget is taken whole in a fresh step of its own (decode rows wait that
    one step); one within the budget joins the decode rows as usual, whole (not cut)."""
    dev = make(64, 4, max_batch_prefill_tokens=8, chunked_prefill=True)
    dev.add("a", 3, 4)
    dev.step()
    dev.add("long", 20, 2, wants_prompt_logprobs=True)
    dev.add("short", 5, 1, wants_prompt_logprobs=True)
    dev.add("after", 10, 1)
    dev.run()
    assert dev.log == [
        [("a", 3, True)],
        [("long", 20, True)],  # alone, whole: 20 > the 7 tokens left beside a's decode row
        [("a", 1, False), ("long", 1, False), ("short", 5, True), ("after", 1, True)],
        [("a", 1, False), ("after", 7, True)],  # after is chunked to the budget
        [("a", 1, False), ("after", 2, True)],
    ]
    for rid, n, new in (("a", 3, 4), ("long", 20, 2), ("short", 5, 1), ("after", 10, 1)):
        assert dev.seqs[rid].output_ids == alone(n, rid, new)
