"""best_of (host only): n sampled sequences for one prompt; the best by mean logprob wins.

Like TGI, each sequence runs as its own sub-request with its own random seed (TGI refuses a
user seed with best_of > 1); the reply is the sequence with the highest mean token logprob
and the others ride along as `best_of_sequences`. The sub-requests are queued together, so
the later ones wait for the first to compute the prompt and then start past its full pages
(the prefix cache): the prompt's pages are held once, only the partial last page and the tail
are per sequence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tgix.engine.request import Completion, GenerationError, GenerationRequest


def mean_logprob(completion: Completion) -> float:
    lps = [t.logprob for t in completion.tokens if t.logprob is not None]
    return sum(lps) / len(lps) if lps else float("-inf")


class BestOfGroup:
    """Collects the sub-requests' terminal items and emits one Completion (or the first
    error) once every sub-request has ended."""

    def __init__(self, request: GenerationRequest, emit: Callable[[Sequence], bool]):
        self.request = request
        self._emit = emit
        self._results: dict[int, Completion | GenerationError] = {}

    def sub_requests(self) -> list[GenerationRequest]:
        one = dataclasses.replace(self.request, best_of=1, request_id=None)
        return [one] * self.request.best_of

    def emitter(self, index: int) -> Callable[[Sequence], bool]:
        def emit(items: Sequence) -> bool:
            for item in items:  # token events are not streamed for best_of
                if isinstance(item, Completion | GenerationError):
                    self._results[index] = item
            if len(self._results) == self.request.best_of:
                self._emit([self._reply()])
            return True

        return emit

    def _reply(self) -> Completion | GenerationError:
        results = [self._results[i] for i in range(self.request.best_of)]
        errors = [r for r in results if isinstance(r, GenerationError)]
        if errors:
            return errors[0]
        ranked = sorted(results, key=mean_logprob, reverse=True)
        return dataclasses.replace(ranked[0], best_of_sequences=tuple(ranked[1:]))
