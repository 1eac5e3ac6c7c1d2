"""One step's plan and its result (host only): the rows the scheduler picked, whatever their mix.

Every step is a list of rows over one ragged token axis. A row is one request's share:

  token_ids   the tokens whose KV this step computes (a prompt or a piece of one, the last
              sampled token, or several: a grammar's forced tokens, later k+1 drafts)
  start_pos   how many of the request's tokens are already in the KV cache (0 for a fresh
              prompt; past a cached prefix or an earlier chunk otherwise)
  pages       the request's pages in position order, covering start_pos + len(token_ids)
  num_logits  how many next-token distributions it wants: 0 for a chunk that stops short of
              its prompt's end, 1 for a decode row or a prompt's end, len(token_ids) for prompt
              logprobs (later k+1 for draft verification)

Fresh, decode and mixed steps are cases of one plan; the runner picks a compiled shape for it
(the attention backend keeps its fast paths). The result gives each row its accepted ids as
a list, even when it holds one id.
"""

from __future__ import annotations

import dataclasses
import enum


class RowKind(enum.StrEnum):
    DECODE = "decode"  # tokens after the prompt: the last sampled one (+ forced ones)
    PROMPT = "prompt"  # a prompt (or a preempted request's recompute) from position 0
    CACHED = "cached"  # a prompt starting past a prefix found in the prefix cache
    CHUNK = "chunk"  # a later piece of a prompt split over several steps


@dataclasses.dataclass(frozen=True, slots=True)
class PlanRow:
    """One request's share of a step (has pack's RowInput fields: token_ids, start_pos, pages)."""

    request_id: str
    kind: RowKind
    token_ids: tuple[int, ...]
    start_pos: int
    pages: tuple[int, ...]
    num_logits: int

    @property
    def produces_token(self) -> bool:
        return self.num_logits > 0

    @property
    def is_prompt(self) -> bool:
        """Computes prompt tokens (a prefill in TGI's words), not generated ones."""
        return self.kind is not RowKind.DECODE

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlan:
    """The rows of one forward: decode rows first, then prompt rows, each in admission order."""

    rows: tuple[PlanRow, ...]

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.rows]

    @property
    def num_tokens(self) -> int:
        """Tokens computed (cached prefixes are not)."""
        return sum(len(r.token_ids) for r in self.rows)

    @property
    def all_logits(self) -> bool:
        """A row wants every token's logits (prompt logprobs)."""
        return any(r.num_logits > 1 for r in self.rows)

    @property
    def verify(self) -> bool:
        """A decode row carries drafts: every token of the step is scored (speculate.py)."""
        return any(r.num_logits > 1 and not r.is_prompt for r in self.rows)

    @property
    def kind(self) -> str:
        """'prefill' when any row computes prompt tokens, else 'decode' (TGI's metric label)."""
        return "prefill" if any(r.is_prompt for r in self.rows) else "decode"


@dataclasses.dataclass(frozen=True, slots=True)
class TokenChoice:
    """One accepted token: its id, logprob and top-n alternatives (id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class HeadDrafts:
    """Medusa heads' guesses for the tokens after position `position` (the one a step just
    sampled): valid while that is still the request's last token."""

    position: int
    tokens: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class StepResult:
    """Per producing row (by request id): its accepted tokens, in order; per prompt row with
    all logits: each of its tokens after the first scored (prompt logprobs: the token's
    logprob and the top-n alternatives at its position; token_id unused)."""

    accepted: dict[str, list[TokenChoice]]
    prompt_logprobs: dict[str, list[TokenChoice]] = dataclasses.field(default_factory=dict)
    head_drafts: dict[str, HeadDrafts] = dataclasses.field(default_factory=dict)

    def ids(self) -> dict[str, list[int]]:
        return {rid: [c.token_id for c in choices] for rid, choices in self.accepted.items()}
