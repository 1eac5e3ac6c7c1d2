"""Commit (host only): a read-back step becomes per-row accepted tokens, and each accepted
token becomes stream events (detokenized, stop-checked) or ends its request.

`step_result` reads the runner's StepOutput (numpy) against the plan's rows; `commit_token`
runs one accepted token through its request: a non-finite logprob or a token the grammar
forbids is an error, else RequestOutput decides the events and whether the request ends;
a grammar's forced continuation is appended right after it (fast-forward).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tgix.engine.plan import HeadDrafts, PlanRow, StepResult, TokenChoice
from tgix.engine.request import GenerationError
from tgix.engine.request_state import RequestState
from tgix.engine.speculate import accepted_length


def _choice(out, i: int) -> TokenChoice:
    top = tuple(zip(out.top_ids[i].tolist(), out.top_logprobs[i].tolist(), strict=True))
    return TokenChoice(int(out.token_ids[i]), float(out.logprobs[i]), top)


def step_result(rows: Sequence[PlanRow], out, *, verify: bool = False) -> StepResult:
    """Accepted tokens of each producing row (one per row: the sampled id; in a verify step
    the samples at the row's k+1 tokens while its drafts match them, speculate.py) and the
    prompt scores of rows that asked for every token's logits (out.prompt_logprobs [T]: entry t
    scores token t + 1 of the packed axis, so a row's n tokens give n - 1 scores; with each,
    the top-n alternatives at that position). With Medusa heads (out.draft_ids), each row's
    head drafts at the position that sampled its last accepted token."""
    accepted, prompt_logprobs, head_drafts, offset = {}, {}, {}, 0
    for i, row in enumerate(rows):
        start, offset = offset, offset + len(row.token_ids)
        if row.num_logits > 1 and out.prompt_logprobs is not None:
            span = slice(start, offset - 1)
            top_ids, top_lps = (
                out.prompt_top_ids[span].tolist(),
                out.prompt_top_logprobs[span].tolist(),
            )
            tops = zip(top_ids, top_lps, strict=True)
            prompt_logprobs[row.request_id] = [
                TokenChoice(0, lp, tuple(zip(ids, lps, strict=True)))
                for lp, (ids, lps) in zip(out.prompt_logprobs[span].tolist(), tops, strict=True)
            ]
        if not row.produces_token:
            continue
        if verify and row.num_logits > 1:
            sampled = out.token_ids[start:offset].tolist()
            n = accepted_length(row.token_ids[1:], sampled)
            at, end = start + n - 1, row.start_pos + n
        else:  # its sample is at its last token (row i of a plain step)
            at, end = (offset - 1 if verify else i), row.end_pos
            n = 1
        accepted[row.request_id] = [_choice(out, t) for t in range(at - n + 1, at + 1)]
        if out.draft_ids is not None:  # the heads' guesses after the token sampled at `end`
            head_drafts[row.request_id] = HeadDrafts(end, tuple(out.draft_ids[at].tolist()))
    return StepResult(accepted, prompt_logprobs, head_drafts)


def commit_token(
    seq: RequestState,
    choice: TokenChoice,
    *,
    at_length: bool,
    fast_forward: bool,
    mask_ready: Callable[[RequestState], bool] = lambda seq: True,
) -> tuple[list, str | GenerationError | None]:
    """Events for one accepted token (already in seq.output_ids) and the finish reason, or
    the error that ends the request. Returns (events, reason). `mask_ready(seq)`: whether
    the grammar's mask at seq's state is built (engine.mask_builder waits a bounded time);
    the fast-forward stops at a state whose mask is not, and sampling finds its forced
    token instead (the only token that mask allows: the same id)."""
    if not math.isfinite(choice.logprob) and choice.logprob != -math.inf:
        return [], GenerationError("non-finite logits", "generation")
    if seq.grammar_failure is not None or not seq.advance_grammar(choice.token_id):
        reason = seq.grammar_failure or "sampled a token the grammar forbids"
        return [], GenerationError(f"grammar: {reason}", "generation")
    top = choice.top[: seq.request.top_n_tokens]
    events, reason = seq.output.add(choice.token_id, choice.logprob, top, at_length=at_length)
    items: list = list(events)
    if reason is None and fast_forward and seq.request.grammar is not None:
        reason = _append_forced_tokens(seq, items, mask_ready)
        if seq.grammar_failure is not None:
            return items, GenerationError(f"grammar: {seq.grammar_failure}", "generation")
    return items, reason


def _append_forced_tokens(seq: RequestState, items: list, mask_ready) -> str | None:
    """Append the grammar's forced continuation (the only allowed token, again and again)
    without sampling: the tokens are emitted now with logprob 0 (probability 1 under the
    mask) and the scheduler feeds them to the model with the next step's row. Stops one
    token short of max_new_tokens so the step still samples."""
    room = seq.max_new_tokens - len(seq.output_ids) - 1
    reason = None
    while room > 0 and reason is None and mask_ready(seq):
        try:
            forced = seq.request.grammar.forced_token(seq.grammar_state)
        except ValueError as exc:  # GrammarError: a lazy grammar's budget (see token_mask)
            seq.grammar_failure = str(exc)
            break
        if forced is None:
            break
        seq.output_ids.append(forced)
        seq.advance_grammar(forced)
        top = [(forced, 0.0)][: seq.request.top_n_tokens]
        events, reason = seq.output.add(forced, 0.0, top)
        items.extend(events)
        room -= 1
    return reason
