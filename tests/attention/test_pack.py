"""pack_step: the exact metadata arrays for ragged rows, padding, and bad input."""

import numpy as np
import pytest

from tgix.attention.pack import RowInput, pack_step


def test_two_rows_prefill_and_decode_exact_arrays():
    rows = [RowInput([11, 12, 13], 0, [5, 2]), RowInput([21], 6, [7, 3])]
    a = pack_step(rows, page_size=4, num_tokens=6, num_rows=3, pages_per_row=3)
    np.testing.assert_array_equal(a["token_ids"], [11, 12, 13, 21, 0, 0])
    np.testing.assert_array_equal(a["positions"], [0, 1, 2, 6, 0, 0])
    # row 1 position 6 -> its second page (3), offset 2 -> slot 3 * 4 + 2
    np.testing.assert_array_equal(a["slot_mapping"], [20, 21, 22, 14, 0, 0])
    np.testing.assert_array_equal(a["token_rows"], [0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(a["cu_q_lens"], [0, 3, 4, 4])
    np.testing.assert_array_equal(a["kv_lens"], [3, 7, 0])
    # row 0's reserved second page (2) holds nothing yet, so it is not in the table
    np.testing.assert_array_equal(a["page_table"], [[5, 0, 0], [7, 3, 0], [0, 0, 0]])
    np.testing.assert_array_equal(a["logits_indices"], [2, 3, 0])


def test_fresh_step_without_page_table():
    rows = [RowInput([11, 12, 13, 14, 15], 0, [5, 2, 9])]
    a = pack_step(rows, page_size=4, num_tokens=8, num_rows=1, pages_per_row=0)
    assert a["page_table"].shape == (1, 0)
    np.testing.assert_array_equal(a["slot_mapping"], [20, 21, 22, 23, 8, 0, 0, 0])
    assert all(v.dtype == np.int32 for v in a.values())


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([RowInput([1] * 5, 0, [1])], "do not fit"),  # 5 tokens, one page of 4
        ([RowInput([1], 0, [1])] * 3, "exceed the bucket"),  # 3 rows > 2
        ([RowInput([1] * 9, 0, [1, 2, 3])], "exceed the bucket"),  # 9 tokens > 8
        ([RowInput([], 0, [1])], "do not fit"),
    ],
)
def test_rejects_what_does_not_fit(rows, message):
    with pytest.raises(ValueError, match=message):
        pack_step(rows, page_size=4, num_tokens=8, num_rows=2, pages_per_row=2)


def test_shared_prefix_pages_of_the_largest_group():
    """Among the leading one-token rows, the largest group whose tables start with the same
    page, the pages all of them hold in common, full history pages only (start_pos //
    page_size), at least SHARED_MIN_PAGES."""
    a, b = list(range(1, 9)), list(range(20, 28))
    rows = [
        RowInput([1], 30, a),  # 7 full history pages (30 // 4)
        RowInput([1], 27, a[:6] + [50, 51]),  # diverges after 6 pages
        RowInput([1], 30, b),  # a group of one
        RowInput([1], 29, a),
        RowInput([1] * 4, 0, [60]),  # a prompt: the leading run of one-token rows ends here
        RowInput([1], 30, a),  # after it: its own pass reads its pages
    ]
    got = pack_step(rows, page_size=4, num_tokens=16, num_rows=7, pages_per_row=8)
    np.testing.assert_array_equal(got["shared_pages"], [6, 6, 0, 6, 0, 0, 0])
    # a common prefix shorter than SHARED_MIN_PAGES is left to the rows
    few = [RowInput([1], 30, a), RowInput([1], 30, a[:3] + [40, 41, 42, 43, 44])]
    got = pack_step(few, page_size=4, num_tokens=2, num_rows=2, pages_per_row=8)
    np.testing.assert_array_equal(got["shared_pages"], [0, 0])
    # a partly written page is not shared: 17 cached tokens hold 4 full pages of 4
    partial = [RowInput([1], 17, a[:5]), RowInput([1], 19, a[:5])]
    got = pack_step(partial, page_size=4, num_tokens=2, num_rows=2, pages_per_row=8)
    np.testing.assert_array_equal(got["shared_pages"], [4, 4])
    # a fresh step (no page table) reads no pages at all
    got = pack_step(rows[:2], page_size=4, num_tokens=2, num_rows=2, pages_per_row=0)
    np.testing.assert_array_equal(got["shared_pages"], [0, 0])
