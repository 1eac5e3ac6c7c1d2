"""tgix.generate: jitted batched generation equals the step-by-step paged driver and transformers,
stops rows at EOS, composes with other jitted code without recompiling, and samples reproducibly.

A batch of prompts of different lengths (5, 11, 17 tokens; right-padded to 17) runs through
page_size 4, so rows cross pages and the padding of both the token axis and the rows is exercised.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.paged import PagedDriver, greedy
from tgix import testing
from tgix.generation import STATIC_ARGNAMES, generate, jit_generate, split_model
from tgix.models import load_model

NEW_TOKENS = 8
PROMPT_LENS = (5, 11, 17)  # > mistral's sliding window (5) and crossing pages of 4


def prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 290, size=n).tolist() for n in PROMPT_LENS]


def padded(batch: list[list[int]]) -> tuple[jax.Array, jax.Array]:
    """Right-padded ids [B, T] and lengths [B]."""
    ids = np.zeros((len(batch), max(map(len, batch))), np.int32)
    for row, prompt in enumerate(batch):
        ids[row, : len(prompt)] = prompt
    return jnp.asarray(ids), jnp.asarray([len(p) for p in batch], jnp.int32)


@functools.cache
def loaded_model(path):
    loaded = load_model(str(path))
    return loaded, *split_model(loaded.model)


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    path = tiny_checkpoints("llama")
    return path, *loaded_model(path)


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_greedy_batch_matches_paged_driver_per_prompt(family, tiny_checkpoints):
    loaded, graphdef, params = loaded_model(tiny_checkpoints(family))
    batch = prompts()
    out = jit_generate(graphdef, params, *padded(batch), max_new_tokens=NEW_TOKENS, page_size=4)
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=4, num_pages=24)
    for row, prompt in enumerate(batch):  # each row equals the prompt decoded on its own
        expected = greedy(driver, prompt, NEW_TOKENS)
        assert out.tokens[row].tolist() == expected, f"{family} row {row}"
    assert out.lengths.tolist() == [NEW_TOKENS] * len(batch)
    assert out.tokens.dtype == jnp.int32


@pytest.mark.reference
def test_greedy_matches_transformers_generate_with_eos(llama):
    path, _, graphdef, params = llama
    ref = testing.load_reference_model(path)
    batch = prompts(seed=1)
    out = jit_generate(
        graphdef, params, *padded(batch), max_new_tokens=NEW_TOKENS, eos_id=testing.EOS_ID
    )
    for row, prompt in enumerate(batch):  # transformers, one prompt at a time, stops at EOS too
        with torch.no_grad():
            full = ref.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=testing.EOS_ID,
                pad_token_id=testing.PAD_ID,
            )
        expected = full[0, len(prompt) :].tolist()
        length = int(out.lengths[row])
        assert length == len(expected), f"row {row}"
        assert out.tokens[row, :length].tolist() == expected, f"row {row}"


def test_eos_stops_one_row_while_others_continue(llama):
    _, _, graphdef, params = llama
    ids, lens = padded(prompts())
    free = jit_generate(graphdef, params, ids, lens, max_new_tokens=NEW_TOKENS).tokens.tolist()
    # an id row 0 produces at step 2 that row 1 never produces: row 0 stops there, row 1 runs on
    eos = next(t for t in free[0][2:] if t not in free[1] and t not in free[0][:2])
    out = jit_generate(graphdef, params, ids, lens, max_new_tokens=NEW_TOKENS, eos_id=[eos, 999])
    for row, tokens in enumerate(free):
        length = tokens.index(eos) + 1 if eos in tokens else NEW_TOKENS
        assert int(out.lengths[row]) == length, f"row {row}"
        assert out.tokens[row].tolist() == tokens[:length] + [eos] * (NEW_TOKENS - length)
    assert int(out.lengths[0]) < NEW_TOKENS and int(out.lengths[1]) == NEW_TOKENS


def test_composes_inside_jit_without_recompiling(llama):
    _, _, graphdef, params = llama
    traces = []

    @jax.jit
    def mean_token(params, ids, lens):
        traces.append(1)  # runs once per trace, not per call
        out = generate(graphdef, params, ids, lens, max_new_tokens=NEW_TOKENS, page_size=4)
        return out.tokens, jnp.mean(out.tokens.astype(jnp.float32))

    first = mean_token(params, *padded(prompts(seed=0)))
    second = mean_token(params, *padded(prompts(seed=2)))  # same shapes, new contents
    assert len(traces) == 1 and mean_token._cache_size() == 1
    assert first[0].tolist() != second[0].tolist()
    direct = jit_generate(graphdef, params, *padded(prompts(seed=2)), max_new_tokens=NEW_TOKENS)
    assert second[0].tolist() == direct.tokens.tolist()
    assert float(second[1]) == pytest.approx(float(direct.tokens.mean()))


def test_sampling_is_reproducible_per_key_and_top_k_1_is_greedy(llama):
    _, _, graphdef, params = llama
    ids, lens = padded(prompts())
    run = jax.jit(functools.partial(generate, max_new_tokens=NEW_TOKENS, top_k=0))
    hot = jnp.float32(5.0)  # flattens the tiny model's peaked logits so draws differ by key
    a = run(graphdef, params, ids, lens, temperature=hot, key=jax.random.key(0)).tokens
    again = run(graphdef, params, ids, lens, temperature=hot, key=jax.random.key(0)).tokens
    b = run(graphdef, params, ids, lens, temperature=hot, key=jax.random.key(1)).tokens
    assert a.tolist() == again.tolist()
    assert a.tolist() != b.tolist()
    greedy_tokens = jit_generate(graphdef, params, ids, lens, max_new_tokens=NEW_TOKENS).tokens
    zero = run(graphdef, params, ids, lens, temperature=jnp.float32(0.0), key=jax.random.key(0))
    assert zero.tokens.tolist() == greedy_tokens.tolist()  # traced 0 falls back to argmax
    sample_top1 = dict(temperature=hot, top_k=1, key=jax.random.key(3))
    top1 = jit_generate(graphdef, params, ids, lens, max_new_tokens=NEW_TOKENS, **sample_top1)
    assert top1.tokens.tolist() == greedy_tokens.tolist()
    assert run._cache_size() == 1  # temperature and key are traced: one compile for all calls


def test_sampling_without_key_is_refused(llama):
    _, _, graphdef, params = llama
    with pytest.raises(ValueError, match="key"):
        generate(graphdef, params, *padded(prompts()), max_new_tokens=2, temperature=0.7)
    assert "max_new_tokens" in STATIC_ARGNAMES
