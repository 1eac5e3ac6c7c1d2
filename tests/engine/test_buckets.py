"""Every step the scheduler can form has a compiled shape, and the smallest one is chosen."""

from types import SimpleNamespace as Row

import pytest

from tgix.engine.buckets import Buckets, StepShape


def rows(lengths, start=0):
    return [Row(token_ids=[7] * n, start_pos=start) for n in lengths]


@pytest.mark.parametrize("prefill,batch,total", [(64, 8, 64), (96, 8, 96), (512, 64, 1024)])
def test_every_fresh_and_decode_step_has_a_shape(prefill, batch, total):
    b = Buckets.build(
        max_batch_prefill_tokens=prefill, max_batch_size=batch, max_total_tokens=total, page_size=4
    )
    shapes = set(b.model_shapes())
    for n_rows in range(1, batch + 1):
        for per_row in (1, 2, prefill // n_rows):  # many short prompts or a full budget
            shape = b.shape_for(rows([max(1, per_row)] * n_rows))
            assert shape in shapes and shape.fresh and shape.num_rows >= n_rows
        decode = b.shape_for(rows([1] * n_rows, start=5))
        assert decode in shapes and decode.num_tokens == decode.num_rows >= n_rows
    assert b.shape_for(rows([total])) in shapes  # a preempted request recomputed whole


def test_smallest_shapes_are_chosen():
    b = Buckets.build(
        max_batch_prefill_tokens=64, max_batch_size=8, max_total_tokens=64, page_size=4
    )
    assert b.shape_for(rows([5])) == StepShape(True, 16, 1, 0)
    assert b.shape_for(rows([2] * 7)) == StepShape(True, 128, 8, 0)  # 7 rows need T >= 112
    assert b.shape_for(rows([1] * 3, start=9)) == StepShape(False, 4, 4, 16)
    with pytest.raises(ValueError, match="needs the mixed shapes"):
        b.shape_for([*rows([1], start=3), *rows([4], start=8)])


def test_prefix_caching_adds_mixed_shapes_for_any_prefill_step():
    """Without chunking, a prefill step may hold a prompt past a cached prefix: the mixed T
    buckets then reach the longest prefill step (a recompute of max_total_tokens)."""
    kw = dict(max_batch_prefill_tokens=64, max_batch_size=8, max_total_tokens=200, page_size=4)
    assert Buckets.build(**kw).mixed_tokens == ()
    cached = Buckets.build(**kw, prefix_caching=True)
    assert cached.mixed_tokens == (16, 32, 64, 128, 256)
    past_prefix = [*rows([1], start=3), *rows([150], start=40)]
    assert cached.shape_for(past_prefix) == StepShape(False, 256, 8, 50)
    chunked = Buckets.build(**kw, chunked_prefill=True, prefix_caching=True)
    assert chunked.mixed_tokens == (16, 32, 48, 64)  # a chunked step stays within the budget


def test_chunked_fresh_steps_stop_at_the_budget_unless_prompt_logprobs_need_a_whole_prompt():
    """With chunking every prompt (and recompute) is cut to the budget, so no fresh step is
    longer than it (or than 16 tokens a row, for many short prompts); a prompt-logprobs prompt
    runs whole (alone)."""
    kw = dict(max_batch_prefill_tokens=256, max_total_tokens=4096, page_size=16)
    chunked = Buckets.build(**kw, max_batch_size=8, chunked_prefill=True)
    assert chunked.prefill_tokens[-1] == 256 and chunked.mixed_tokens[-1] == 256
    many_rows = Buckets.build(**kw, max_batch_size=64, chunked_prefill=True)
    assert many_rows.prefill_tokens[-1] == 1024  # 64 one-token prompts: rows_for(1024) = 64
    assert many_rows.shape_for(rows([1] * 64)) == StepShape(True, 1024, 64, 0)
    logprobs = Buckets.build(**kw, max_batch_size=8, chunked_prefill=True, prompt_logprobs=True)
    assert logprobs.prefill_tokens[-1] == 4096
    assert logprobs.shape_for(rows([4000]), all_logits=True) == StepShape(True, 4096, 8, 0, True)
    assert Buckets.build(**kw, max_batch_size=8).prefill_tokens[-1] == 4096  # classic


def test_prompt_steps_pad_by_less_than_half():
    """Fresh buckets step by 1.5x and 2x alternately from 32: a prompt of n > 32 tokens runs
    in fewer than 1.5 n (powers of two alone pad 65 tokens to 128)."""
    b = Buckets.build(
        max_batch_prefill_tokens=4096, max_batch_size=64, max_total_tokens=4096, page_size=16
    )
    assert b.prefill_tokens[:6] == (16, 32, 48, 64, 96, 128)
    for n in range(33, 4097):
        assert n <= b.shape_for(rows([n])).num_tokens < 1.5 * n


@pytest.mark.parametrize("batch", [8, 10, 64])
def test_mixed_shapes_never_coincide_with_decode_shapes(batch):
    """A mixed shape has fewer rows than tokens (T / 2), so the backend, which runs the
    per-token decode path when T = R, gives prompt rows the mixed path: a 64-token step
    past a cached prefix in the 64-row decode shape read its history once per token."""
    b = Buckets.build(
        max_batch_prefill_tokens=512,
        max_batch_size=batch,
        max_total_tokens=1024,
        page_size=16,
        prefix_caching=True,
    )
    shapes = set(b.model_shapes())
    mixed = [s for s in shapes if not s.fresh and s.num_tokens != s.num_rows]
    decode = [s for s in shapes if not s.fresh and s.num_tokens == s.num_rows]
    assert {s.num_tokens for s in mixed} == set(b.mixed_tokens)
    assert len(decode) == len(b.decode_rows)
    assert all(s.num_rows <= batch for s in mixed)
    assert {s.num_rows for s in mixed} <= {*b.decode_rows, batch}  # no new sampler shapes
    turn = b.shape_for(rows([34], start=1008))
    assert turn in shapes and turn.num_tokens == 64 and turn.num_rows == 8
    for n_rows in range(1, batch + 1):  # decode rows beside one prompt chunk
        for chunk in (2, 40, 300):
            step = b.shape_for([*rows([1] * (n_rows - 1), start=5), *rows([chunk], start=9)])
            assert step in shapes and step.num_rows >= n_rows
            assert step.num_tokens >= n_rows - 1 + chunk and step.num_tokens > step.num_rows


def test_speculation_adds_verify_shapes_of_rows_times_k_plus_1():
    b = Buckets.build(
        max_batch_prefill_tokens=64,
        max_batch_size=8,
        max_total_tokens=64,
        page_size=4,
        speculate=3,
        speculate_rows=4,
    )
    verify = [s for s in b.model_shapes() if s.verify]
    assert verify == [StepShape(False, 4 * r, r, 16, verify=True) for r in (1, 2, 4)]
    assert b.shape_for(rows([4, 2, 1], start=9), verify=True) == verify[2]
    assert verify[2].num_samples == 16 and b.shape_for(rows([1], start=5)).num_samples == 1
    assert {(16, 1), (16, 64)} <= set(b.sampler_shapes())  # the sampler runs per token
    plain = Buckets.build(
        max_batch_prefill_tokens=64, max_batch_size=8, max_total_tokens=64, page_size=4
    )
    assert not [s for s in plain.model_shapes() if s.verify]


def test_mixed_steps_of_few_rows_take_the_small_row_shape():
    """A chat turn beside a few decode rows runs in R = 8 (the LM head and the sampler for 8
    rows, not T / 2); more rows take the T / 2 shape of the same T, or a larger T; chunked
    mixed T step by 1.5x and 2x like fresh ones."""
    b = Buckets.build(
        max_batch_prefill_tokens=128,
        max_batch_size=64,
        max_total_tokens=4096,
        page_size=16,
        chunked_prefill=True,
        prefix_caching=True,
    )
    assert b.mixed_tokens == (16, 32, 48, 64, 96, 128)
    shapes = set(b.model_shapes())
    mixed = sorted((s.num_tokens, s.num_rows) for s in shapes if not s.fresh and not s.verify)
    mixed = [m for m in mixed if m[0] != m[1]]  # decode shapes have T = R
    assert mixed == [(16, 8), (32, 8), (32, 16), (48, 8), (48, 16), (64, 8), (64, 32),
                     (96, 8), (96, 32), (128, 8), (128, 64)]  # fmt: skip
    turn = [*rows([1] * 3, start=1150), *rows([80], start=1150)]
    assert b.shape_for(turn) == StepShape(False, 96, 8, 256)
    busy = [*rows([1] * 12, start=1150), *rows([80], start=1150)]
    assert b.shape_for(busy) == StepShape(False, 96, 32, 256)
    full = [*rows([1] * 40, start=1150), *rows([30], start=1150)]
    assert b.shape_for(full) == StepShape(False, 128, 64, 256)  # 70 tokens but 41 rows
