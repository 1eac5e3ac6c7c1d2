"""Speculative decoding's host side (numpy, no jax): who proposes drafts, and how far a draft
may go before the step verifies it.

A proposer guesses the next k tokens of a request from what it has (`Proposer.propose(seq,
k)`). `NgramProposer` is prompt lookup: the longest suffix of prompt + generated ids (8 down to
3 tokens) that occurred earlier, and the tokens that followed its latest earlier occurrence.
TGI's rule is the 1-gram, first-match case (`create_n_gram_speculation`); a longer, more
recent match is the better guess on code edits and extractive answers, where the text being
copied is the one the last tokens came from, and shorter matches than 3 keep too few drafts
to pay for a verify step (MIN_MATCH). Once a draft was taken from a place in the context,
the text is taken to go on copying from there (`RequestState.copy_point`): a match of
LOCAL_MIN_MATCH+ tokens within LOCAL_WINDOW tokens after that place comes first, which
re-aligns a file being rewritten two tokens after an edit instead of three, and picks the
copied occurrence over a later, unrelated one. `MedusaProposer` hands on what a
Medusa model's heads guessed in the request's last step (tgix/models/medusa.py), while the
token they guessed after is still the request's last one.

`plan_draft` turns a proposal into what the step may verify: never past max_new_tokens (the
k+1 sampled tokens must fit), cut after an EOS or the token whose text completes a stop
sequence, and for a grammar row only as long as every
draft token is allowed and the mask after it is already built (the host walks the grammar's
states; each draft position is masked with its own state, not the row's pre-draft one). The
grammar's own forced tokens are the surest proposer of all and need no verification: the
engine's fast-forward appends them at commit (commit.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tgix.engine.mask_builder import has_mask

if TYPE_CHECKING:
    from tgix.engine.request_state import RequestState

LOOKBACK = 8192  # tokens searched for a match (the scan is linear in it)
# Prompt lookup's shortest match. What a draft keeps, by the length n of the suffix match
# it came from (default model, `benchmarks.speculate`'s code / QA / chat answers, 7-token
# drafts): n = 1 0.2-0.6 tokens, n = 2 0.5-1.9, n = 3 1.3-4.2, n >= 8 5.7-6.6. With the
# Dense kernels stored [out, in], the engine's verify step of 1 row x 8 tokens costs ~1.57
# decode steps past 1,000 tokens of history (1 x 2 tokens: 1.26), down from ~2.2; replayed
# at those costs, drafts from 2-token or 1-token matches (of 7 tokens, or of 1 in a 2-token
# step) still lose to n = 3 on all three workloads (BENCHMARKS.md, "Verify steps after the
# [out, in] kernels").
MIN_MATCH = 3
# Near the place a row was copying from (see the module docstring): the shortest match there,
# and how far past that place it may start. Offline over the same answers (BENCHMARKS.md,
# speculative decoding, 2026-12-07), in decode-step units with a verify step at 2.2: code
# 1.884 -> 1.986 tokens a unit, QA 1.795 -> 1.804, chat 1.001 -> 0.990; 1-token matches
# or a window of 48 measured worse.
LOCAL_MIN_MATCH = 2
LOCAL_WINDOW = 16


class Proposer(Protocol):
    def propose(self, seq: RequestState, k: int) -> tuple[int, ...]:
        """Up to k guessed tokens after seq's last one (may be fewer, or none)."""
        ...


@dataclasses.dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup over the request's own tokens: the longest suffix n-gram (max_n down to
    min_n) found earlier in ids, latest occurrence first; its k followers are the draft.
    A match whose continuation is shorter than k (it ran into the end) gives what there is."""

    max_n: int = 8
    min_n: int = MIN_MATCH
    local_window: int = LOCAL_WINDOW  # 0: no preference for where the row was copying

    def propose(self, seq: RequestState, k: int) -> tuple[int, ...]:
        """The draft, remembering where in the context it was copied from."""
        ids, anchor = anchored_context(seq)
        draft, end = self.locate(ids, k, anchor)
        if draft:
            seq.copy_point = (seq.total_len, seq.total_len - len(ids) + end)
        return draft

    def lookup(self, ids: Sequence[int], k: int, anchor: int | None = None) -> tuple[int, ...]:
        """The draft after ids (the last LOOKBACK of them are searched)."""
        return self.locate(ids, k, anchor)[0]

    def locate(self, ids: Sequence[int], k: int, anchor: int | None = None):
        """(draft, index in ids of its first token): a match near `anchor` (the index in ids
        the text would copy next) first, else the longest latest one; ((), -1) for none."""
        if k <= 0 or len(ids) < 2:
            return (), -1
        if anchor is not None and self.local_window:
            end = local_match(ids, anchor, self.min_n, self.local_window)
            if end is not None:
                return tuple(int(t) for t in ids[end : end + k]), end
        seq = np.asarray(ids[-LOOKBACK:], dtype=np.int64)
        ends, size = match_ends(seq, self.min_n), len(seq)
        for n in range(self.min_n + 1, self.max_n + 1):  # keep those the longer suffix matches
            longer = ends[(ends >= n) & (ends <= size - n)]
            longer = longer[seq[longer - n] == seq[size - n]]
            if not longer.size:
                break
            ends = longer
        if not ends.size:
            return (), -1
        end = int(ends[-1])
        return tuple(int(t) for t in seq[end : end + k]), len(ids) - size + end


def anchored_context(seq: RequestState) -> tuple[list[int], int | None]:
    """(context_ids(seq), where its text would copy next as an index into them: the last
    draft's source moved on by every token since, None before any draft)."""
    ids = context_ids(seq)
    if seq.copy_point is None:
        return ids, None
    made_at, source = seq.copy_point
    moved = seq.total_len - made_at  # tokens since that draft
    return ids, source + moved - (seq.total_len - len(ids))  # ids start at total - len(ids)


def local_match(ids: Sequence[int], anchor: int, min_n: int, window: int) -> int | None:
    """The first end e in [anchor, anchor + window] of an earlier occurrence of ids' last n
    (n = min_n, then LOCAL_MIN_MATCH when shorter), or None. Plain list slices: at most
    2 x 17 comparisons of a few ids, on the path of every drafting step."""
    size = len(ids)
    for n in (min_n, LOCAL_MIN_MATCH) if min_n > LOCAL_MIN_MATCH else (min_n,):
        suffix = list(ids[size - n :])
        if min(suffix) < 0:  # a placeholder (run-ahead) matches nothing
            return None
        for e in range(max(anchor, n), min(anchor + window, size - n) + 1):
            if list(ids[e - n : e]) == suffix:
                return e
    return None


def context_ids(seq: RequestState) -> list[int]:
    """The last LOOKBACK of the request's prompt + output ids: what prompt lookup searches."""
    tail = seq.output_ids[-LOOKBACK:]
    if len(tail) < LOOKBACK:
        tail = seq.prompt_ids[len(tail) - LOOKBACK :] + tail
    return tail


def match_ends(seq: np.ndarray, n: int) -> np.ndarray:
    """Ends e, ascending, of the earlier occurrences of seq's last n ids (seq[e - n : e] ==
    seq[-n:]) that end by the time that suffix starts (e <= len(seq) - n). One vector
    comparison per suffix position (n is small)."""
    size = len(seq)
    if n <= 0 or size < 2 * n:
        return np.zeros(0, dtype=np.int64)
    ok = np.ones(size - 2 * n + 1, dtype=bool)  # for e = n .. size - n
    for j in range(1, n + 1):
        ok &= seq[n - j : size - n + 1 - j] == seq[size - j]
    return np.flatnonzero(ok) + n


def repeats_context(seq: RequestState, n: int | None = None) -> bool:
    """Whether the request's last n (default MIN_MATCH) known ids occurred earlier in its
    context: the text is copying (a quote, a rewritten file), and prompt lookup has a draft.
    A row paused after rejected drafts (pause_after) drafts anyway then. A placeholder
    (run-ahead) matches nothing."""
    return _repeats(context_ids(seq), MIN_MATCH if n is None else n)


def _repeats(ids: list[int], n: int) -> bool:
    """Whether ids' last n (no placeholder among them) occurred earlier in ids."""
    if len(ids) <= n or min(ids[-n:]) < 0:
        return False
    return match_ends(np.asarray(ids, dtype=np.int64), n).size > 0


class MedusaProposer:
    """A Medusa model's drafts: its heads' argmaxes from the step that sampled the request's
    last token (none when that step ran without heads, or when tokens were appended since,
    such as a grammar's forced ones)."""

    def propose(self, seq: RequestState, k: int) -> tuple[int, ...]:
        heads = seq.head_drafts
        if heads is None or heads.position != seq.total_len - 1:
            return ()
        return heads.tokens[:k]


def may_draft(seq: RequestState, proposer: Proposer) -> bool:
    """Whether seq's next step may carry drafts, judged from its known ids (what the engine
    asks before running a step ahead, which leaves that step without drafts). Prompt
    lookup drafts only past a repeated MIN_MATCH-gram (or a LOCAL_MIN_MATCH-gram near where
    the row was copying), so a row whose last known ids repeat none runs ahead (free chat
    keeps run-ahead's overlap); other proposers may draft unless the row is paused and not
    copying."""
    if isinstance(proposer, NgramProposer):  # one context; the cheap local check first
        ids, anchor = anchored_context(seq)
        window = proposer.local_window
        near = anchor is not None and window > 0
        if near and local_match(ids, anchor, proposer.min_n, window) is not None:
            return True
        return _repeats(ids, proposer.min_n)
    return seq.draft_pause == 0 or repeats_context(seq)


@dataclasses.dataclass(frozen=True)
class Draft:
    """What a row verifies: draft tokens, and the grammar state before each of its k+1
    sampled positions (empty without a grammar)."""

    tokens: tuple[int, ...] = ()
    states: tuple = ()


NO_DRAFT = Draft()


def plan_draft(seq: RequestState, proposer: Proposer, k: int, eos: frozenset[int]) -> Draft:
    """The draft for seq's next step, within what the host can see: at most k tokens and
    max_new_tokens - generated - 1 (every position samples), ending at an EOS or at a stop
    sequence's last token, and for a
    grammar row stopping before a token its state forbids or a state whose mask is not
    built. A request that decodes more than one fed token (forced tokens pending) or wants
    more than its row (prompt logprobs) gets none."""
    room = min(k, seq.max_new_tokens - len(seq.output_ids) - 1)
    if room <= 0 or seq.num_computed != seq.total_len - 1 or not seq.output_ids:
        return NO_DRAFT
    if seq.output_ids[-1] < 0:  # a placeholder (run-ahead): the last token is not known yet
        return NO_DRAFT
    tokens = proposer.propose(seq, room)
    if not tokens:
        return NO_DRAFT
    if not (seq.request is not None and seq.request.ignore_eos):
        for i, t in enumerate(tokens):
            if t in eos:
                tokens = tokens[: i + 1]
                break
    if seq.output is not None:
        tokens = tokens[: seq.output.draft_length(tokens)]
    grammar = None if seq.request is None else seq.request.grammar
    if grammar is None:
        return Draft(tuple(tokens))
    if seq.grammar_failure is not None:
        return NO_DRAFT
    states = [seq.grammar_state]
    for t in tokens:
        try:
            state = grammar.advance(states[-1], t)
        except ValueError:  # forbidden here (or a lazy grammar's budget): the draft ends
            break
        if not has_mask(grammar, state):
            break
        states.append(state)
    return Draft(tuple(tokens[: len(states) - 1]), tuple(states)) if len(states) > 1 else NO_DRAFT


def accepted_length(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many of a row's k+1 sampled tokens it keeps: sampled[j] scores the position after
    drafts[:j], so each draft that equals the token sampled before it lets the next sample
    count too; the first mismatch (that sample replaces the draft) or the last ends it."""
    n = 1
    for draft, pick in zip(drafts, sampled, strict=False):
        if draft != pick:
            break
        n += 1
    return min(n, len(sampled))


def pause_after(misses: int) -> int:
    """Decode steps a row skips drafting after a verify step that kept none of its drafts,
    `misses` counting such steps (each one that kept a draft halves it): 1, 3, 7, then 15.
    Text that does not repeat its context (free chat, where a chance hit now and then must
    not restart drafting every step) then costs verify steps rarely, and a row whose drafts
    start hitting again (a quote, a copied block) is back to drafting every step within a few
    steps. A paused row whose text repeats its context drafts anyway (repeats_context).
    While every row pauses, decode steps run ahead."""
    return min(2**misses - 1, 15)


MAX_SPECULATE = 8  # --speculate above this is refused (each verify shape holds R * (k+1))
# A verify step stops paying once its R * (k+1) tokens make the step compute-bound. On XLA:CPU
# (f32, SmolLM2-135M, 2 cores) the step of 1 row x 4-8 tokens costs ~1.6 decode steps
# past 1,000 tokens of history, and 2 rows x 8 tokens 2.25 (BENCHMARKS.md, "Verify steps
# after the [out, in] kernels"; ~2.2 from T=3 before them): past 8 tokens the drafts would
# have to be nearly always right. Accelerators stay memory-bound far longer (TGI skips Medusa
# above 128 tokens; not measured here yet).
VERIFY_TOKENS = {"cpu": 8, "accelerator": 128}


def speculate_rows(
    speculate: int, max_rows: int, *, on_cpu: bool, verify_tokens: int | None = None
) -> int:
    """The most decode rows a step gives drafts to: a power of two (a verify bucket) with
    rows * (speculate + 1) <= verify_tokens (default VERIFY_TOKENS), at least 1, at most
    max_rows."""
    if speculate <= 0:
        return 0
    tokens = verify_tokens or VERIFY_TOKENS["cpu" if on_cpu else "accelerator"]
    limit = tokens // (speculate + 1)
    rows = 1
    while rows * 2 <= min(limit, max_rows):
        rows *= 2
    return rows


def speculate_for(requested: int | None, heads: int) -> int:
    """Draft tokens per step: what --speculate asked for, else (None) a Medusa model's head
    count, as TGI does, else 0. More than the model has heads is refused (ValueError)."""
    if requested is None:
        return heads
    if heads and requested > heads:
        raise ValueError(
            f"--speculate {requested}: this Medusa model has {heads} heads, so at most "
            f"{heads} draft tokens per step"
        )
    return requested
