"""Speculative decoding (--speculate k): whatever the drafts, a request's tokens are the ones
it gets without them. Greedy and seeded sampling, every family, k = 1, 3, 5; drafts that are
always right (an oracle that knows the answer), always wrong, and n-gram lookup; mixed
batches, stop sequences, EOS and max_new_tokens inside a draft, grammar rows, penalties and
top_n_tokens; accepted drafts counted as TGI's skipped tokens; pages back after each."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.engine.conftest import assert_pages_back, make_engine, release_engines, wait_idle
from tests.engine.test_engine import greedy, ids, prompt
from tgix import testing
from tgix.engine.request import Completion, GenerationRequest, SamplingParams
from tgix.engine.request_state import RequestState
from tgix.engine.speculate import (
    NO_DRAFT,
    NgramProposer,
    accepted_length,
    may_draft,
    plan_draft,
    repeats_context,
    speculate_rows,
)
from tgix.grammar import GrammarSpec

VOCAB = testing.TOKENIZER_VOCAB_SIZE


class NoDrafts:
    def propose(self, seq, k):
        return ()


class Oracle:
    """Knows each prompt's answer (prompt -> ids without drafts): every draft is right.
    `wrong_from`: from that draft position on, drafts are off by one (rejected)."""

    def __init__(self, answers: dict, wrong_from: int | None = None):
        self.answers, self.wrong_from = answers, wrong_from

    def propose(self, seq, k):
        seq_ids = seq.all_ids()
        for p, answer in self.answers.items():
            if tuple(seq_ids[: len(p)]) == p:
                done = len(seq_ids) - len(p)
                draft = list(answer[done : done + k])
                if self.wrong_from is not None:
                    wrong = draft[self.wrong_from :]
                    draft[self.wrong_from :] = [(t % (VOCAB - 3)) + 3 for t in wrong]
                return tuple(draft)
        return ()


class Garbage:
    """Drafts the model never picks (rejected at the first position, or wherever)."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def propose(self, seq, k):
        return tuple(int(t) for t in self.rng.integers(3, VOCAB, k))


# ---------------------------------------------------------------------------- host parts


def test_ngram_takes_the_longest_latest_match():
    p = NgramProposer(max_n=3, min_n=1).lookup  # over a list of ids
    #           0  1  2  3  4  5  6  7  8  9
    assert p([5, 6, 7, 1, 2, 5, 6, 7, 3, 4, 6, 7], 2) == (3, 4)  # "6 7" latest: 3 4
    assert p([1, 2, 3, 9, 9, 2, 3, 8, 1, 2, 3], 3) == (9, 9, 2)  # 3-gram over 2-gram
    assert p([1, 2, 3, 1, 2], 5) == (3, 1, 2)  # runs into the end: what there is
    assert p([1, 2, 3, 4], 3) == ()  # no earlier occurrence of any suffix
    assert p([4, 4], 2) == (4,)
    assert p([7], 3) == () and p([1, 2, 1], 0) == ()
    assert NgramProposer(max_n=3, min_n=2).lookup([1, 2, 3, 9, 3], 2) == ()
    # longer than half the ids: no earlier occurrence fits
    assert NgramProposer(max_n=8, min_n=1).lookup([1, 2, 1, 2, 1], 2) == (2, 1)
    # a request's ids: the prompt (1 2 3), then its output; the default wants 3-gram matches
    assert NgramProposer().propose(seq_of([1, 2, 3, 4, 1]), 2) == ()
    assert NgramProposer().propose(seq_of([4, 1, 2, 3]), 2) == (4, 1)
    # does a row's last 3 known ids repeat its context? (placeholders never)
    assert repeats_context(seq_of([4, 1, 2, 3])) and not repeats_context(seq_of([4, 1, 2]))
    assert not repeats_context(seq_of([4, 1, 2, -1])) and not repeats_context(seq_of([]))
    assert repeats_context(seq_of([4, 1, 2]), 2)
    # may the next step draft? (else the engine may run it ahead): prompt lookup needs a
    # repeated 3-gram; other proposers draft unless paused (and not copying)
    ngram, other = NgramProposer(), NoDrafts()
    assert may_draft(seq_of([4, 1, 2, 3]), ngram) and not may_draft(seq_of([4, 1, 2]), ngram)
    paused = seq_of([4, 1, 2])
    assert may_draft(paused, other)
    paused.draft_pause = 3
    assert not may_draft(paused, other)
    paused.output_ids.append(3)  # "1 2 3" again: copying
    assert may_draft(paused, other)


def test_accepted_length():
    assert accepted_length((), [5]) == 1
    assert accepted_length((4, 5, 6), [4, 5, 6, 7]) == 4  # all drafts and the bonus token
    assert accepted_length((4, 5, 6), [4, 9, 6, 7]) == 2  # 9 replaces the draft 5
    assert accepted_length((4, 5, 6), [1, 5, 6, 7]) == 1


def test_ngram_prefers_a_match_where_the_text_was_copying():
    """After a draft copied from index e, the text is taken to copy on from there: a 2-token
    match within LOCAL_WINDOW past that place beats a longer, later match elsewhere; past the
    window the longest latest match holds. A row whose last 3 ids repeat nothing may still
    draft (not run ahead) when its last 2 match where it was copying."""
    filler = list(range(100, 120))
    ids = [20, 5, 6, 30, 31, 32, *filler, 9, 5, 6, 50, 51, 9, 5, 6]
    ngram = NgramProposer()
    assert ngram.lookup(ids, 2) == (50, 51)  # "9 5 6" latest, ends at 29
    assert ngram.locate(ids, 2, anchor=3) == ((30, 31), 3)  # "5 6" ends at 3, in [3, 19]
    assert ngram.lookup(ids, 2, anchor=10) == (50, 51)  # nothing in [10, 26]
    assert NgramProposer(local_window=0).locate(ids, 2, anchor=3) == ((50, 51), 29)
    seq = RequestState("r", ids[:26], 20, output_ids=ids[26:])
    seq.num_computed = seq.total_len - 1
    seq.copy_point = (32, 1)  # drafted at length 32 from index 1: 2 tokens on, it copies 3
    assert ngram.propose(seq, 2) == (30, 31) and seq.copy_point == (34, 3)
    seq.copy_point = None
    assert ngram.propose(seq, 2) == (50, 51) and seq.copy_point == (34, 29)
    copying = RequestState("c", [20, 5, 6, 30, 31, 32, *filler], 20, output_ids=[7, 5, 6])
    assert not repeats_context(copying) and not may_draft(copying, ngram)
    copying.copy_point = (29, 3)  # "7 5 6" repeats nothing, but "5 6" ends where it copies
    assert may_draft(copying, ngram) and not may_draft(copying, NgramProposer(local_window=0))


def seq_of(output, max_new=20, **request):
    req = GenerationRequest(prompt_ids=(1, 2, 3), max_new_tokens=max_new, **request)
    s = RequestState("r", [1, 2, 3], max_new, request=req, output_ids=list(output))
    s.num_computed = s.total_len - 1
    return s


class Fixed:
    def __init__(self, *tokens):
        self.tokens = tokens

    def propose(self, seq, k):
        return self.tokens[:k]


def test_plan_draft_stays_inside_what_the_host_can_see():
    eos = frozenset({2})
    assert plan_draft(seq_of([7]), Fixed(8, 9, 10), 3, eos).tokens == (8, 9, 10)
    assert plan_draft(seq_of([7]), Fixed(8, 2, 10), 3, eos).tokens == (8, 2)  # ends at EOS
    assert plan_draft(seq_of([7], ignore_eos=True), Fixed(8, 2, 10), 3, eos).tokens == (8, 2, 10)
    # every position samples: with 3 of 5 generated, 1 draft + 1 sample reach max_new
    assert plan_draft(seq_of([7, 7, 7], max_new=5), Fixed(8, 9), 3, eos).tokens == (8,)
    assert plan_draft(seq_of([7, 7, 7, 7], max_new=5), Fixed(8, 9), 3, eos) is NO_DRAFT
    assert plan_draft(seq_of([-1]), Fixed(8), 3, eos) is NO_DRAFT  # run-ahead placeholder
    pending = seq_of([7, 8])
    pending.num_computed -= 1  # two fed tokens (a grammar's forced ones)
    assert plan_draft(pending, Fixed(8), 3, eos) is NO_DRAFT


class Letters:
    """A tokenizer whose id i decodes to one letter (3 -> "a", 4 -> "b", ...)."""

    hf = SimpleNamespace(all_special_ids=[])
    eos_token_ids = (2,)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(94 + i) for i in ids)


def test_plan_draft_ends_at_the_token_that_completes_a_stop_sequence():
    from tgix.engine.output import RequestOutput

    def seq_with_stop(stop, done=(3,)):
        s = seq_of([], stop=stop)
        s.output = RequestOutput(s.request, Letters(), s.output_ids, seed=None)
        for t in done:  # "a" generated and recorded, as commit does
            s.output_ids.append(t)
            s.output.add(t, 0.0)
        s.num_computed = s.total_len - 1
        return s

    eos = frozenset({2})
    # drafts "b c d e": the stop "cd" ends with "d", the third draft; "e" would be cut anyway
    assert plan_draft(seq_with_stop(("cd",)), Fixed(4, 5, 6, 7), 4, eos).tokens == (4, 5, 6)
    # a stop begun by the generated text ("ab": "a" is held) ends with the first draft
    assert plan_draft(seq_with_stop(("ab",)), Fixed(4, 5, 6), 3, eos).tokens == (4,)
    # no stop reached: the whole draft; the matcher is not moved by looking ahead
    s = seq_with_stop(("zz", "ce"))
    assert plan_draft(s, Fixed(4, 5, 6), 3, eos).tokens == (4, 5, 6)
    assert plan_draft(s, Fixed(5, 7), 3, eos).tokens == (5, 7)


class ToyGrammar:
    """States count digits typed; only digits are allowed; state 2 has no built mask."""

    def advance(self, state, token):
        if not 10 <= token < 20:
            raise ValueError("not a digit")
        return state + 1

    def has_mask(self, state):
        return state != 2


def test_plan_draft_walks_a_grammar_and_keeps_each_positions_state(monkeypatch):
    import tgix.engine.speculate as speculate

    monkeypatch.setattr(speculate, "has_mask", lambda g, s: g.has_mask(s))
    s = seq_of([11], grammar=ToyGrammar())
    s.grammar_state = 0
    draft = plan_draft(s, Fixed(12, 5, 13), 3, frozenset())
    assert (draft.tokens, draft.states) == ((12,), (0, 1))  # 5 is forbidden: the draft ends
    assert plan_draft(s, Fixed(12, 13, 14), 3, frozenset()).tokens == (12,)  # state 2: no mask
    s.grammar_failure = "budget"
    assert plan_draft(s, Fixed(12), 3, frozenset()) is NO_DRAFT


def test_speculate_rows_keeps_verify_steps_small():
    assert speculate_rows(0, 8, on_cpu=True) == 0
    assert speculate_rows(3, 8, on_cpu=True) == 2  # 2 * 4 tokens
    assert speculate_rows(2, 8, on_cpu=True) == 2
    assert speculate_rows(5, 8, on_cpu=True) == 1
    assert speculate_rows(8, 8, on_cpu=True) == 1  # always one row
    assert speculate_rows(3, 8, on_cpu=False) == 8  # at most max_rows
    assert speculate_rows(3, 8, on_cpu=True, verify_tokens=16) == 4


# ---------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engines(tiny_checkpoints, xla_cache):
    """(family, k) -> a speculating engine (compiled on demand: few shapes run here); verify
    steps of up to 16 tokens (4 rows at k = 3), so batches of several rows draft."""
    made = {}

    def get(family="llama", k=3, **kw):
        key = (family, k, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_engine(
                tiny_checkpoints(family), xla_cache, speculate=k, compile=False,
                verify_tokens=16, **kw,
            )  # fmt: skip
        eng = made[key]
        eng.proposer = NoDrafts()
        return eng

    yield get
    release_engines(made.values())


def collect(engine, requests):
    """Submit all at once, read each stream: (events' ids, completion) per request."""
    streams = [engine.submit(r) for r in requests]
    out = []
    for stream in streams:
        events = list(stream)
        final = events[-1]
        assert isinstance(final, Completion)
        out.append(([e.token.id for e in events[:-1]], final))
    return out


def answers_and_checks(engine, requests, proposer_for):
    """Run requests without drafts, then with proposer_for(answers): same ids, streamed ids
    equal the completion's, pages back. Returns (without, with) completions."""
    engine.proposer = NoDrafts()
    plain = collect(engine, requests)
    answers = {r.prompt_ids: ids(c) for r, (_, c) in zip(requests, plain, strict=True)}
    engine.proposer = proposer_for(answers)
    drafted = collect(engine, requests)
    for (_, a), (streamed, b) in zip(plain, drafted, strict=True):
        assert ids(b) == ids(a) and streamed == ids(b)
        assert (b.generated_text, b.finish_reason) == (a.generated_text, a.finish_reason)
        assert b.generated_tokens == a.generated_tokens == len(ids(b))
    assert_pages_back(engine)
    return [c for _, c in plain], [c for _, c in drafted]


def test_right_drafts_are_kept_and_counted_as_skipped_tokens(engines):
    engine = engines("llama", 3)
    requests = [greedy(13, prompt_ids=prompt(1, 9))]
    _, (c,) = answers_and_checks(engine, requests, Oracle)
    # 13 tokens: the first from the prompt step, then steps of 1 fed + 3 drafts = 4 tokens
    assert c.skipped_tokens == 9
    _, (c,) = answers_and_checks(engine, requests, lambda a: Oracle(a, wrong_from=1))
    assert c.skipped_tokens == 6  # steps keep the right draft and the sample after it: 2 each


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_ids_do_not_change_with_any_drafts(engines, k):
    engine = engines("llama", k)
    requests = [greedy(24, prompt_ids=prompt(s, 3 + 5 * s)) for s in range(3)]
    requests.append(greedy(20, prompt_ids=prompt(9, 6) * 4))  # repeats: n-gram drafts hit
    for proposer in (Oracle, lambda a: Oracle(a, wrong_from=k // 2), lambda a: Garbage()):
        answers_and_checks(engine, requests, proposer)
    engine.proposer = NgramProposer()
    _, drafted = answers_and_checks(engine, requests, lambda a: NgramProposer())
    assert wait_idle(engine)["batch_size"] == 0


@pytest.mark.parametrize("family", testing.SPECULATION_FAMILIES)
def test_every_family_gives_the_same_ids(engines, family):
    engine = engines(family, 3)
    requests = [greedy(16, prompt_ids=prompt(3, 11)), greedy(12, prompt_ids=prompt(4, 5) * 3)]
    _, drafted = answers_and_checks(engine, requests, Oracle)
    assert sum(c.skipped_tokens for c in drafted) > 0


def test_seeded_sampling_penalties_and_top_n_do_not_change(engines):
    engine = engines("llama", 3)
    settings = [
        SamplingParams(do_sample=True, seed=5, top_k=7, top_p=0.9),
        SamplingParams(do_sample=True, temperature=0.7, seed=9, typical_p=0.8),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingParams(presence_penalty=1.0, watermark=True),
        SamplingParams(do_sample=True, seed=3, repetition_penalty=1.2, watermark=True),
    ]
    requests = [
        greedy(18, prompt_ids=prompt(50 + i, 4 + i), sampling=s, top_n_tokens=2)
        for i, s in enumerate(settings)
    ]
    plain, drafted = [], []  # groups within speculate_rows (4): every row drafts
    for group in (requests[:3], requests[3:]):
        a, b = answers_and_checks(engine, group, Oracle)
        plain, drafted = plain + a, drafted + b
    for a, b in zip(plain, drafted, strict=True):
        for got, want in ((b.tokens, a.tokens), *zip(b.top_tokens, a.top_tokens, strict=True)):
            assert [t.id for t in got] == [t.id for t in want]
            got_lp, want_lp = [t.logprob for t in got], [t.logprob for t in want]
            np.testing.assert_allclose(got_lp, want_lp, atol=1e-4)
    assert all(c.skipped_tokens > 0 for c in drafted)


def test_stop_sequence_and_max_new_tokens_inside_a_draft(engines):
    engine = engines("llama", 5)
    base = greedy(20, prompt_ids=prompt(61, 7))
    engine.proposer = NoDrafts()
    ((_, full),) = collect(engine, [base])
    stop = engine.tokenizer.decode(ids(full)[7:9])
    requests = [
        GenerationRequest(prompt_ids=base.prompt_ids, max_new_tokens=20, stop=(stop,)),
        *(greedy(n, prompt_ids=prompt(62, 5)) for n in (1, 2, 3, 7, 8)),
    ]
    plain, _ = answers_and_checks(engine, requests, Oracle)
    assert plain[0].finish_reason == "stop_sequence" and len(plain[0].tokens) <= 9
    assert [len(c.tokens) for c in plain[1:]] == [1, 2, 3, 7, 8]


def test_eos_inside_a_draft(engines, tiny_checkpoints, xla_cache):
    engine = engines("llama", 3)
    p = prompt(70, 8)
    engine.proposer = NoDrafts()
    ((_, c),) = collect(engine, [greedy(20, prompt_ids=p)])
    eos_id = ids(c)[6]  # the 7th token becomes an EOS for this engine
    eos_engine = engines("llama", 3, extra_eos_ids=(eos_id,))
    plain, drafted = answers_and_checks(eos_engine, [greedy(20, prompt_ids=p)], Oracle)
    assert plain[0].finish_reason == "eos_token" and ids(plain[0])[-1] == eos_id
    assert ids(plain[0]) == ids(c)[: ids(c).index(eos_id) + 1]


@pytest.fixture(scope="module")
def grammars(engines):
    compiler = engines("llama", 3).grammar_compiler
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    return [
        compiler.compile(GrammarSpec.json(schema)),
        compiler.compile(GrammarSpec.regex(r"(ab|cd)[a-z]{3,9}-[0-9]{2,6}")),
    ]


def test_grammar_rows_beside_free_rows(engines, grammars):
    engine = engines("llama", 3)
    requests = [
        greedy(40, prompt_ids=prompt(80, 6), grammar=grammars[0]),
        greedy(30, prompt_ids=prompt(81, 9), grammar=grammars[1]),
        GenerationRequest(
            prompt_ids=prompt(82, 5),
            max_new_tokens=30,
            grammar=grammars[1],
            sampling=SamplingParams(do_sample=True, seed=4, temperature=1.3),
        ),
        greedy(25, prompt_ids=prompt(83, 4)),
    ]
    plain, drafted = answers_and_checks(engine, requests, Oracle)
    assert plain[0].finish_reason == "eos_token"
    assert sum(c.skipped_tokens for c in drafted[:3]) > 0
    answers_and_checks(engine, requests, lambda a: Garbage(1))


def test_more_rows_than_speculate_rows_decode_without_drafts(engines):
    engine = engines("llama", 3)
    rows = engine.scheduler.config.speculate_rows
    requests = [greedy(10, prompt_ids=prompt(90 + i, 3 + i)) for i in range(rows + 2)]
    answers_and_checks(engine, requests, Oracle)


def test_skipped_tokens_reach_tgis_metric():
    from prometheus_client import CollectorRegistry

    from server.metrics import RequestMetrics, render

    registry = CollectorRegistry()
    limits = SimpleNamespace(max_input_tokens=8, max_total_tokens=16)
    metrics = RequestMetrics(limits, registry)
    done = Completion(
        generated_text="ab", finish_reason="length", generated_tokens=4, seed=None,
        input_length=2, tokens=(), skipped_tokens=3,
    )  # fmt: skip
    metrics.succeeded(done, total_s=0.1, validation_s=0.0, max_new_tokens=4)
    lines = render(registry).decode().splitlines()
    assert "tgi_request_skipped_tokens_sum 3.0" in lines
