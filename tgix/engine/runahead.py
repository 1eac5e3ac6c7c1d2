"""Run-ahead overlap (host only): dispatch decode step N+1, fed by step N's sampled ids on the
device, before step N is read back, so detokenizing and streaming N overlap N+1's compute.

Step N is then committed early: the scheduler records it with PLACEHOLDER ids, schedules
N+1 from that state, and the real ids replace the placeholders when N is read back
(`fill_placeholders`). Only when every row decodes one token that nothing on the host needs
first (no penalties, watermark or grammar, no length stop at this step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tgix.engine.plan import PlanRow, StepPlan
from tgix.engine.request_state import RequestState

PLACEHOLDER = -1  # a sampled id not read back yet


@dataclasses.dataclass(eq=False)
class InFlight:
    """A dispatched step: its plan, the rows as sent, their requests (None: ended meanwhile),
    the device results."""

    plan: StepPlan
    rows: tuple[PlanRow, ...]
    seqs: list[RequestState | None]
    handle: object  # runner.StepOutput of device arrays
    started: float
    committed_early: bool = False  # on_step_done already ran with PLACEHOLDER ids


def can_run_ahead(rows: Sequence[PlanRow], seqs: Sequence[RequestState | None]) -> bool:
    """A decode step whose next tokens need not be read first: every row decodes one token,
    none needs its history on the host (penalties, watermark) or its grammar state (the next
    mask depends on the token), none ends by length now."""
    for row, seq in zip(rows, seqs, strict=True):
        if seq is None or row.is_prompt or len(row.token_ids) != 1:
            return False
        if seq.params.uses_penalties or seq.params.watermark or seq.request.grammar:
            return False
        if len(seq.output_ids) + 1 >= seq.max_new_tokens:
            return False
    return True


def is_same_decode(plan: StepPlan, inflight: InFlight) -> bool:
    """The next plan decodes exactly the rows in flight, one token each, in the same order: it
    can take the in-flight step's device ids as its input."""
    if plan.request_ids != [r.request_id for r in inflight.rows]:
        return False
    return all(not r.is_prompt and len(r.token_ids) == 1 for r in plan.rows)


def placeholders(inflight: InFlight) -> dict[str, list[int]]:
    return {r.request_id: [PLACEHOLDER] for r in inflight.rows}


def fill_placeholders(seqs: Mapping[str, RequestState], accepted: Mapping[str, list[int]]):
    """Write a read-back step's ids over the placeholders its early commit left."""
    for request_id, ids in accepted.items():
        seq = seqs.get(request_id)
        if seq is not None and seq.output_ids[-len(ids) :] == [PLACEHOLDER] * len(ids):
            seq.output_ids[-len(ids) :] = ids


def with_real_tokens(rows: Sequence[PlanRow], seqs: Mapping[str, RequestState]) -> list[PlanRow]:
    """Rows scheduled while their last token was a placeholder, with the sampled ids."""
    patched = []
    for row in rows:
        seq = seqs.get(row.request_id)
        if seq is None or PLACEHOLDER not in row.token_ids:
            patched.append(row)
            continue
        ids = seq.all_ids()[row.start_pos : row.end_pos]
        patched.append(dataclasses.replace(row, token_ids=tuple(max(t, 0) for t in ids)))
    return patched
