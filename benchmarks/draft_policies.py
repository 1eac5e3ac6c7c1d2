"""Prompt-lookup drafting policies replayed offline over the default model's greedy answers.

    python -m benchmarks.draft_policies [--answers PATH] [--verify-cost 1.57] [--short-cost 1.26]
        [--draft 7]

The answers to `benchmarks.speculate`'s workloads (code editing, extractive QA, free chat) are
generated once with speculation off (saved to --answers, reused when it exists). Each policy
then walks every answer as the engine would at concurrency 1: at each step the proposer sees
the prompt + the answer so far (a RequestState, so `copy_point` carries over), the draft is
cut to what is left, kept while it equals the answer, and a verify step that kept none pauses
the row (speculate.pause_after) unless its last 3 tokens repeat its context. Run-ahead is not
modelled (the engine runs a step ahead only when no row may draft). Cost is in decode steps:
1 for a step without a draft, --verify-cost for a verify step (a 1-row x 8-token step
measured 1.57 decode steps past 1,000 tokens of history on 2 cores, BENCHMARKS.md; 2.2
before the Dense kernels were stored [out, in]), --short-cost for a step verifying a
1-token draft (1 row x 2 tokens: 1.26), which the tiered policies use after a weak match.
Prompt steps are the same for every policy and left out. Output: tokens per unit (higher is
better) and the verify / decode step counts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tgix.engine.request_state import RequestState
from tgix.engine.speculate import LOCAL_WINDOW, NgramProposer, pause_after, repeats_context

WORKLOADS = (("code", 256), ("qa", 96), ("chat", 128))


class Tiered:
    """The default proposer's draft; without one, `short` tokens after a match of `weak`
    tokens (a 2-token step where the engine would have a shape for it)."""

    def __init__(self, weak: int, short: int = 1):
        self.strong, self.weak, self.short = NgramProposer(), NgramProposer(min_n=weak), short
        self.last_short = False  # whether the last draft came from the weak match

    def propose(self, seq, k: int) -> tuple[int, ...]:
        draft = self.strong.propose(seq, k)
        self.last_short = not draft
        return draft or self.weak.propose(seq, min(k, self.short))


POLICIES = {
    "longest latest match (3+ tokens)": NgramProposer(local_window=0),
    f"copy point first (window {LOCAL_WINDOW}, the default)": NgramProposer(),
    "copy point first (window 48)": NgramProposer(local_window=48),
    "copy point first (2+ tokens)": NgramProposer(min_n=2),
    "default, else 1 token after a 2-token match": Tiered(2),
    "default, else 1 token after a 1-token match": Tiered(1),
}


def greedy_answers(path: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    if path.exists():
        return json.loads(path.read_text())
    from benchmarks.speculate import make_engine, run_workload, workload_prompts

    engine = make_engine(0, 16384)
    out = {}
    for name, max_new in WORKLOADS:
        prompts = workload_prompts(engine.tokenizer, name)
        ids = run_workload(engine, prompts, max_new, 1)["ids"]
        out[name] = list(zip(prompts, ids, strict=True))
    engine.shutdown()
    path.write_text(json.dumps(out))
    return out


def replay(
    proposer, prompt, answer, k: int, verify_cost: float, short_cost: float | None = None
) -> tuple[float, int, int]:
    """(cost, verify steps, decode steps) of one answer; its first token came from the prompt
    step. A Tiered proposer's weak-match draft costs short_cost (None: verify_cost)."""
    seq = RequestState("r", list(prompt), len(answer), output_ids=list(answer[:1]))
    cost, verify, decode, misses, pause = 0.0, 0, 0, 0, 0
    while len(seq.output_ids) < len(answer):
        pos = len(seq.output_ids)
        room = min(k, len(answer) - pos - 1)
        may = pause == 0 or repeats_context(seq)  # a paused row that is copying drafts anyway
        draft = proposer.propose(seq, room) if may and room > 0 else ()
        pause = max(pause - 1, 0) if not draft else pause
        if not draft:
            cost, decode = cost + 1, decode + 1
            seq.output_ids.append(answer[pos])
            continue
        kept = 0
        for guess, token in zip(draft, answer[pos:], strict=False):
            if guess != token:
                break
            kept += 1
        short = short_cost is not None and getattr(proposer, "last_short", False)
        cost, verify = cost + (short_cost if short else verify_cost), verify + 1
        misses = misses + 1 if kept == 0 else misses // 2
        pause = pause_after(misses) if kept == 0 else 0
        seq.output_ids.extend(answer[pos : pos + kept + 1])
    return cost, verify, decode


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", default="/tmp/tgix-draft-answers.json")
    parser.add_argument("--verify-cost", type=float, default=1.57)
    parser.add_argument("--short-cost", type=float, default=1.26)
    parser.add_argument("--draft", type=int, default=7)
    args = parser.parse_args(argv)
    answers = greedy_answers(Path(args.answers))
    print(f"{'workload':9} {'policy':44} tokens/unit  verify  decode")
    for name, pairs in answers.items():
        for label, proposer in POLICIES.items():
            runs = [
                replay(proposer, p, a, args.draft, args.verify_cost, args.short_cost)
                for p, a in pairs
            ]
            tokens = sum(len(a) - 1 for _, a in pairs)
            cost = sum(r[0] for r in runs)
            verify, decode = sum(r[1] for r in runs), sum(r[2] for r in runs)
            print(f"{name:9} {label:44} {tokens / cost:11.3f}  {verify:6d}  {decode:6d}")


if __name__ == "__main__":
    main()
