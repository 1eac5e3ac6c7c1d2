"""Grammar-constrained generation in the engine on a tiny random model: whatever the model
prefers, the output is in the grammar's language, ends with EOS only where complete, and
unconstrained requests in the same batch are unaffected."""

from __future__ import annotations

import json
import re
import threading
import uuid

import jsonschema
import pytest

from tests.engine.test_engine import greedy, ids, prompt, run
from tgix.engine.request import GenerationRequest, SamplingParams
from tgix.grammar import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiled(engine):
    compiler = engine.grammar_compiler
    assert compiler is not None
    return {
        "date": compiler.compile(GrammarSpec.regex(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]")),
        "json": compiler.compile(GrammarSpec.json(SCHEMA)),
        "choice": compiler.compile(GrammarSpec.regex(r"(yes|no|maybe)")),
    }


def text(engine, completion) -> str:
    return engine.tokenizer.decode(
        [t for t in ids(completion) if t not in engine.tokenizer.eos_token_ids]
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_output_is_in_the_regex_language_and_ends_with_eos(engine, compiled, seed):
    c = run(engine, greedy(40, prompt_ids=prompt(seed, 9), grammar=compiled["date"]))
    assert c.finish_reason == "eos_token"
    assert ids(c)[-1] in engine.tokenizer.eos_token_ids
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", text(engine, c))


def test_json_schema_output_parses_and_validates(engine, compiled):
    for seed in range(3):
        sampling = SamplingParams(do_sample=True, temperature=1.5, seed=seed)
        request = GenerationRequest(
            prompt_ids=prompt(10 + seed, 7),
            max_new_tokens=80,
            sampling=sampling,
            grammar=compiled["json"],
        )
        c = run(engine, request)
        if c.finish_reason == "length":  # a random model may ramble inside a string
            continue
        assert c.finish_reason == "eos_token"
        jsonschema.validate(json.loads(text(engine, c)), SCHEMA)


def test_length_limit_mid_grammar_reports_length(engine, compiled):
    c = run(engine, greedy(3, prompt_ids=prompt(5, 6), grammar=compiled["json"]))
    assert c.finish_reason == "length" and len(ids(c)) == 3
    assert text(engine, c).startswith("{")


def test_unconstrained_rows_unchanged_next_to_constrained_ones(engine, compiled):
    alone = [run(engine, greedy(12, prompt_ids=prompt(40 + i, 5 + i))) for i in range(3)]
    results: dict = {}

    def go(key, request):
        results[key] = run(engine, request)

    threads = [
        threading.Thread(target=go, args=(i, greedy(12, prompt_ids=prompt(40 + i, 5 + i))))
        for i in range(3)
    ]
    threads += [
        threading.Thread(
            target=go, args=(f"g{i}", greedy(30, prompt_ids=prompt(60 + i, 4), grammar=g))
        )
        for i, g in enumerate([compiled["choice"], compiled["date"], compiled["json"]])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(3):
        assert ids(results[i]) == ids(alone[i])
    assert text(engine, results["g0"]) in ("yes", "no", "maybe")
    assert results["g0"].finish_reason == "eos_token"


def test_best_of_and_seeded_sampling_keep_each_sequence_in_the_language(engine, compiled):
    sampling = SamplingParams(do_sample=True, seed=7, temperature=2.0)
    request = GenerationRequest(
        prompt_ids=prompt(3, 5),
        max_new_tokens=20,
        sampling=sampling,
        best_of=2,
        grammar=compiled["choice"],
    )
    first, again = run(engine, request), run(engine, request)
    assert text(engine, first) in ("yes", "no", "maybe")
    assert ids(first) == ids(again)


def test_unconstrained_values_through_the_run_time_stack(engine):
    """With no explicit any-value levels every container inside the object goes through
    tgix.grammar.pushdown's stack: sampled outputs that end are JSON objects."""
    from tgix.grammar import GrammarCompiler, GrammarOptions
    from tgix.grammar.pushdown import PushdownIndex

    vocab = engine.grammar_compiler.vocab
    compiler = GrammarCompiler(vocab, GrammarOptions(any_value_depth=0), workers=0)
    grammar = compiler.compile(GrammarSpec.json({"type": "object"}))
    assert isinstance(grammar, PushdownIndex)
    ended = []
    for seed in range(6):
        sampling = SamplingParams(do_sample=True, temperature=1.5, seed=seed)
        request = GenerationRequest(
            prompt_ids=prompt(30 + seed, 6), max_new_tokens=40, sampling=sampling, grammar=grammar
        )
        c = run(engine, request)
        if c.finish_reason == "eos_token":
            ended.append(json.loads(text(engine, c)))
        else:
            assert c.finish_reason == "length" and text(engine, c).startswith("{")
    assert ended and all(isinstance(value, dict) for value in ended)


FORCED = r'\{"answer": (yes|no), "because": "[a-z]{1,6}"\}'


def test_forced_tokens_fast_forward_in_mixed_steps(engine, tiny_checkpoints, xla_cache):
    """With chunked prefill (mixed step shapes) forced tokens skip sampling: same greedy ids
    as masking them one step at a time, logprob 0, and fewer steps."""
    from tests.engine.conftest import make_engine, wait_idle

    request = greedy(40, prompt_ids=prompt(8, 6))
    # classic prefill without prefix caching compiles no mixed shapes: one token a step
    plain = make_engine(tiny_checkpoints("llama"), xla_cache, prefix_caching=False)
    try:
        grammar = plain.grammar_compiler.compile(GrammarSpec.regex(FORCED))
        steps_before = plain.scheduler.stats()["steps"]
        masked = run(plain, GenerationRequest(**{**_fields(request), "grammar": grammar}))
        masked_steps = plain.scheduler.stats()["steps"] - steps_before
        assert wait_idle(plain)["fast_forwarded_tokens"] == 0
    finally:
        plain.shutdown()
    # the buckets of test_engine_modes' chunked engine: its executables are cached
    chunked = make_engine(
        tiny_checkpoints("llama"), xla_cache, chunked_prefill=True, max_batch_prefill_tokens=16
    )
    try:
        assert chunked.stats()["fast_forwarded_tokens"] == 0
        g = chunked.grammar_compiler.compile(GrammarSpec.regex(FORCED))
        steps_before = chunked.scheduler.stats()["steps"]
        fast = run(chunked, GenerationRequest(**{**_fields(request), "grammar": g}))
        fast_steps = chunked.scheduler.stats()["steps"] - steps_before
        stats = wait_idle(chunked)
    finally:
        chunked.shutdown()
    assert ids(fast) == ids(masked)
    assert re.fullmatch(FORCED, text(engine, fast))
    forced = stats["fast_forwarded_tokens"]
    assert forced >= 4  # '{"answer": ' and '", "because": "' at least
    assert fast_steps == masked_steps - forced
    assert sum(t.logprob == 0.0 for t in fast.tokens) >= forced


def _fields(request: GenerationRequest) -> dict:
    return {f: getattr(request, f) for f in request.__dataclass_fields__}


def test_llm_generate_takes_a_schema_or_a_spec(tiny_checkpoints, xla_cache):
    from tests.engine.conftest import LIMITS
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest
    from tgix.grammar import GrammarError

    options = EngineOptions(compilation_cache=xla_cache, progress=False, max_top_n_tokens=3)
    with LLM(str(tiny_checkpoints("llama")), limits=LimitRequest(**LIMITS), options=options) as llm:
        [c] = llm.generate(list(prompt(21, 5)), max_new_tokens=60, grammar=SCHEMA)
        if c.finish_reason == "eos_token":
            jsonschema.validate(json.loads(c.generated_text), SCHEMA)
        else:
            assert c.finish_reason == "length" and c.generated_text.startswith("{")
        [d] = llm.generate(list(prompt(22, 5)), max_new_tokens=9, grammar=GrammarSpec.regex("ab?c"))
        assert d.generated_text in ("ac", "abc") and d.finish_reason == "eos_token"
        with pytest.raises(GrammarError):  # admits nothing
            llm.generate("x", grammar={"type": "integer", "minimum": 3, "maximum": 2})


def test_a_lazy_grammar_past_its_budget_ends_its_request_alone(engine):
    """The engine's compiler builds grammars lazily: when a state's mask cannot be built
    within the grammar's per-call budget, that request ends with a grammar error event and
    an unconstrained request in the same batch finishes as it would alone."""
    from tgix.engine.request import GenerationError

    fresh = uuid.uuid4().hex  # never in the compiler's disk cache (it would load eagerly)
    grammar = engine.grammar_compiler.compile(GrammarSpec.regex(fresh + r"[a-c]{2}-[0-9]{3}"))
    assert grammar.stats.get("lazy") and grammar.mask(grammar.start).any()
    grammar.budget_s = -1.0  # every state not built yet is now past its budget
    plain = greedy(12, prompt_ids=prompt(71, 6))
    alone = ids(run(engine, plain))
    streams = [
        engine.submit(greedy(12, prompt_ids=prompt(70, 6), grammar=grammar)),
        engine.submit(greedy(12, prompt_ids=prompt(71, 6))),
    ]
    with pytest.raises(GenerationError, match="grammar: .*time budget"):
        list(streams[0])
    *_, final = streams[1]
    assert ids(final) == alone and final.finish_reason == "length"


def test_rows_held_for_a_mask_built_off_the_engine_thread_get_the_same_ids(engine):
    """With no wait budget every new state's mask is built on the mask builder's thread while
    its row sits steps out: the ids equal a second run over the masks now built (no row
    held), the output is in the language, and the unconstrained row beside it gets its ids
    alone (pages: checked by the conftest)."""
    fresh = "k" + uuid.uuid4().hex[:6]  # a new grammar: built lazily, not from the disk cache
    schema = {
        "type": "object",
        "properties": {fresh: {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
        "required": [fresh, "n"],
        "additionalProperties": False,
    }
    grammar = engine.grammar_compiler.compile(GrammarSpec.json(schema))
    assert grammar.stats.get("lazy")
    plain = greedy(16, prompt_ids=prompt(71, 6))
    alone = ids(run(engine, plain))
    masks = engine.mask_builder
    budget, held = masks.budget_s, masks.held
    masks.budget_s = 0.0
    try:
        streams = [
            engine.submit(greedy(40, prompt_ids=prompt(70, 6), grammar=grammar)),
            engine.submit(plain),
        ]
        *_, first = streams[0]
        *_, other = streams[1]
    finally:
        masks.budget_s = budget
    assert masks.held > held
    held = masks.held
    again = run(engine, greedy(40, prompt_ids=prompt(70, 6), grammar=grammar))
    assert masks.held == held  # every mask it needs is built now
    assert ids(first) == ids(again) and ids(other) == alone
    if first.finish_reason == "eos_token":
        json.loads(text(engine, first))
