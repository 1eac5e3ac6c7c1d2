"""The compiler: worker processes give the same index as inline compiles, errors cross the
process boundary as GrammarError, caches (memory and disk) hit, budgets end compiles."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from transformers import AutoTokenizer

from tgix import testing
from tgix.grammar import GrammarCompiler, GrammarError, GrammarOptions, GrammarSpec

DATE = GrammarSpec.regex(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    testing.write_test_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


def same(a, b) -> bool:
    return (a.masks == b.masks).all() and (a.dfa.table == b.dfa.table).all()


def test_worker_process_matches_inline_and_reports_errors(tokenizer):
    inline = GrammarCompiler.for_tokenizer(tokenizer, workers=0)
    pooled = GrammarCompiler.for_tokenizer(tokenizer, workers=1)
    try:
        assert same(pooled.compile(DATE), inline.compile(DATE))
        with pytest.raises(GrammarError, match="unsupported"):
            pooled.compile(GrammarSpec.regex("a(?=b)"))
        with pytest.raises(GrammarError, match="not supported"):
            pooled.compile(GrammarSpec.json({"type": "array", "uniqueItems": True}))

        async def together():
            return await asyncio.gather(
                *(pooled.compile_async(GrammarSpec.regex("x+y")) for _ in range(3))
            )

        first, *rest = asyncio.run(together())
        assert all(r is first for r in rest)  # one compile, shared
    finally:
        pooled.close()


def test_memory_and_disk_caches(tokenizer, tmp_path):
    compiler = GrammarCompiler.for_tokenizer(tokenizer, workers=0, cache_dir=tmp_path)
    index = compiler.compile(DATE)
    assert compiler.compile(DATE) is index
    assert len(list(tmp_path.glob("*.npz"))) == 1
    fresh = GrammarCompiler.for_tokenizer(tokenizer, workers=0, cache_dir=tmp_path)
    loaded = fresh.compile(DATE)
    assert loaded is not index and same(loaded, index)
    assert np.array_equal(loaded.row_of, index.row_of)
    other_options = GrammarCompiler.for_tokenizer(
        tokenizer, workers=0, cache_dir=tmp_path, options=GrammarOptions(whitespace=" ?")
    )
    assert other_options.key(DATE) != compiler.key(DATE)


def test_time_and_state_budgets(tokenizer):
    slow = GrammarCompiler.for_tokenizer(
        tokenizer, workers=1, options=GrammarOptions(timeout_s=0.2)
    )
    small = GrammarCompiler.for_tokenizer(
        tokenizer, workers=0, options=GrammarOptions(max_states=50)
    )
    try:
        with pytest.raises(GrammarError, match="time budget"):
            slow.compile(GrammarSpec.regex(r"[^\x00]{0,3000}"))
        assert slow.compile(GrammarSpec.regex("[ab]")).num_states >= 1  # worker still serves
        with pytest.raises(GrammarError, match="too large"):
            small.compile(GrammarSpec.regex("[a-z]{0,100}"))
    finally:
        slow.close()


def test_nested_values_cross_the_worker_and_the_disk_cache(tokenizer, tmp_path):
    """A grammar with a run-time stack (tgix.grammar.pushdown) keeps it through a worker
    process and an .npz round trip: the same masks along a deeply nested instance."""
    spec = GrammarSpec.json({"type": "object"})
    options = GrammarOptions(any_value_depth=0)
    inline = GrammarCompiler.for_tokenizer(tokenizer, workers=0, options=options)
    pooled = GrammarCompiler.for_tokenizer(
        tokenizer, workers=1, cache_dir=tmp_path, options=options
    )
    try:
        indexes = [inline.compile(spec), pooled.compile(spec)]
    finally:
        pooled.close()
    fresh = GrammarCompiler.for_tokenizer(tokenizer, workers=0, cache_dir=tmp_path, options=options)
    indexes.append(fresh.compile(spec))  # from disk
    assert all(type(i).__name__ == "PushdownIndex" for i in indexes)
    ids = tokenizer.encode('{"a": [[{"b": [1, {}]}], []]}', add_special_tokens=False)
    states = [i.start for i in indexes]
    for t in ids:
        masks = [i.mask(s) for i, s in zip(indexes, states, strict=True)]
        assert all(np.array_equal(masks[0], m) for m in masks[1:])
        states = [i.advance(s, t) for i, s in zip(indexes, states, strict=True)]
    assert all(i.is_accepting(s) for i, s in zip(indexes, states, strict=True))


def test_a_burst_of_large_grammars_does_not_hold_a_small_one(tokenizer, monkeypatch):
    """Large specs compile in their own lane: a one-line regex submitted behind four big
    enums finishes before the first of them; a full lane refuses at once (GrammarBusy)."""
    from tgix.grammar import compiler as compiler_module

    pooled = GrammarCompiler.for_tokenizer(tokenizer, workers=1)
    try:
        pooled.compile(GrammarSpec.regex("[0-9]"))  # the small lane's worker is up
        pooled.compile(GrammarSpec.json({"enum": ["w" * 3000]}))  # and the large lane's
        enums = [
            GrammarSpec.json({"enum": [f"value-{seed}-{i}" for i in range(4000)]})
            for seed in range(4)
        ]
        order: list[str] = []
        big = [pooled.submit(spec) for spec in enums]
        for n, future in enumerate(big):
            future.add_done_callback(lambda f, n=n: order.append(f"enum{n}"))
        small = pooled.submit(GrammarSpec.regex("[a-z]+@[a-z]+"))
        small.add_done_callback(lambda f: order.append("regex"))
        small.result(timeout=60)
        for future in big:
            future.result(timeout=300)
        assert order[0] == "regex", order
        monkeypatch.setattr(compiler_module, "QUEUE_LIMIT", 1)
        held = pooled.submit(GrammarSpec.json({"enum": [f"x{i}" for i in range(3000)]}))
        with pytest.raises(compiler_module.GrammarBusy, match="busy"):
            pooled.compile(GrammarSpec.json({"enum": [f"y{i}" for i in range(3000)]}))
        held.result(timeout=300)
    finally:
        pooled.close()
