"""Pack one step's rows into the paged-attention metadata arrays (host only: numpy, no jax).

Rows are requests; each contributes its new tokens (a prefill chunk or one decode token) to the
shared token axis T. Arrays are padded to static buckets (T_pad tokens, R_pad rows, P pages per
row) so one compiled step serves any mix; padding tokens write to the null page 0. pages_per_row=0
leaves the page table empty ([R, 0]) for steps that read no pages (fresh prefills). This is the
`pack` of the backends that keep the page layout (tgix.attention.contract.PagedLayout).

It also finds the step's shared prefix (`shared_prefix_pages`): history pages that several
decode rows' tables begin with, the same physical pages (prefix caching hands every chat over
one system prompt the same ones). The XLA decode path reads those once for all those rows, in
one batched pass, instead of gathering them for each row's token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RowInput:
    """One request's share of a step.

    token_ids  the new tokens (prompt chunk or the last sampled token)
    start_pos  how many of its tokens are already in the KV cache
    pages      its page ids in position order, covering start_pos + len(token_ids) tokens
    """

    token_ids: Sequence[int]
    start_pos: int
    pages: Sequence[int]


def pack_step(
    rows: Sequence[RowInput],
    *,
    page_size: int,
    num_tokens: int,
    num_rows: int,
    pages_per_row: int,
) -> dict[str, np.ndarray]:
    """int32 arrays for AttentionMetadata plus `token_ids` [T] and `logits_indices` [R]
    (the last new token of each row, where its next-token logits are read)."""
    total = sum(len(r.token_ids) for r in rows)
    if total > num_tokens or len(rows) > num_rows:
        raise ValueError(
            f"{total} tokens / {len(rows)} rows exceed the bucket "
            f"({num_tokens} tokens, {num_rows} rows)"
        )
    out = {
        "token_ids": np.zeros(num_tokens, np.int32),
        "positions": np.zeros(num_tokens, np.int32),
        "slot_mapping": np.zeros(num_tokens, np.int32),  # 0 = null page
        "token_rows": np.zeros(num_tokens, np.int32),
        "cu_q_lens": np.full(num_rows + 1, total, np.int32),
        "kv_lens": np.zeros(num_rows, np.int32),
        "page_table": np.zeros((num_rows, pages_per_row), np.int32),
        "logits_indices": np.zeros(num_rows, np.int32),
        "shared_pages": np.zeros(num_rows, np.int32),
    }
    cursor = 0
    for i, row in enumerate(rows):
        n = len(row.token_ids)
        end_pos = row.start_pos + n
        needed = -(-end_pos // page_size)  # pages holding its KV; reserved ones beyond are unread
        if n == 0 or len(row.pages) < needed or (pages_per_row and needed > pages_per_row):
            raise ValueError(
                f"row {i}: {n} new tokens at {row.start_pos} do not fit "
                f"{len(row.pages)} pages of {page_size} (max {pages_per_row})"
            )
        pages = np.asarray(row.pages[:needed], np.int32)
        positions = np.arange(row.start_pos, end_pos, dtype=np.int32)
        span = slice(cursor, cursor + n)
        out["token_ids"][span] = row.token_ids
        out["positions"][span] = positions
        out["slot_mapping"][span] = (
            pages[positions // page_size] * page_size + positions % page_size
        )
        out["token_rows"][span] = i
        out["cu_q_lens"][i] = cursor
        out["kv_lens"][i] = end_pos
        if pages_per_row:
            out["page_table"][i, :needed] = pages
        out["logits_indices"][i] = cursor + n - 1
        cursor += n
    if pages_per_row:
        members, count = shared_prefix_pages(rows, page_size)
        out["shared_pages"][members] = count
    return out


SHARED_MIN_PAGES = 4  # a shorter common prefix is left to the rows' own passes


def shared_prefix_pages(rows: Sequence[RowInput], page_size: int) -> tuple[list[int], int]:
    """(rows, pages): among the leading run of one-token rows (decode rows: the attention
    paths gather their pages token by token; a prompt row's own pass already reads its
    history once for all its tokens), the largest group whose tables begin with the same
    page, and how many leading pages all of them hold in common, counting only pages full
    of history (start_pos // page_size). ([], 0) when no two rows share SHARED_MIN_PAGES.
    Linear in the rows' history pages."""
    full = [row.start_pos // page_size for row in rows]
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if len(row.token_ids) != 1:
            break
        if full[i] >= SHARED_MIN_PAGES:
            groups.setdefault(row.pages[0], []).append(i)
    members = max(groups.values(), key=len, default=[])
    if len(members) < 2:
        return [], 0
    width = min(full[i] for i in members)
    table = np.asarray([row_pages[:width] for row_pages in (rows[i].pages for i in members)])
    differs = np.flatnonzero((table != table[0]).any(axis=0))  # [columns where rows disagree]
    count = int(differs[0]) if differs.size else width
    return (members, count) if count >= SHARED_MIN_PAGES else ([], 0)
