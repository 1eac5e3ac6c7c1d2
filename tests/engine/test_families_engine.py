"""Every non-Llama family through the engine: greedy ids equal transformers' (its own
forward with a KV cache, argmax over the tokenizer's ids) for two prompts decoded together;
an MoE model's expert load in engine stats equals transformers' routing, token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.engine.conftest import make_engine, release_engines, wait_idle
from tgix import testing
from tgix.engine.request import GenerationRequest

VOCAB = testing.TOKENIZER_VOCAB_SIZE
PROMPTS = ((5, 17, 42, 8, 99, 3, 250, 61, 7), (12, 130, 44, 9, 77, 21, 200, 31, 64, 11, 90, 15, 3))
NEW_TOKENS = 10
# the shapes these requests use compile on demand (the numerics are the point here)
SMALL = dict(max_total_tokens=48, max_batch_prefill_tokens=48, max_batch_total_tokens=256,
             max_batch_size=2, compile=False, warmup=False)  # fmt: skip


def hf_greedy(model, prompt, n):
    """transformers' forward with its cache, argmax over the tokenizer's ids each step."""
    ids, out, cache = torch.tensor([prompt]), [], None
    with torch.no_grad():
        for _ in range(n):
            result = model(ids, cache=cache, use_cache=True)
            cache = result.past_key_values
            out.append(int(result.logits[0, -1, :VOCAB].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


@pytest.fixture(scope="module")
def engines():
    made = []
    yield made
    release_engines(made)


@pytest.mark.parametrize("family", testing.NEW_FAMILIES)
def test_greedy_ids_equal_transformers(family, tiny_checkpoints, xla_cache, engines):
    path = tiny_checkpoints(family)
    engine = make_engine(path, xla_cache, **SMALL)
    engines.append(engine)
    streams = [
        engine.submit(GenerationRequest(prompt_ids=p, max_new_tokens=NEW_TOKENS)) for p in PROMPTS
    ]
    finals = [list(s)[-1] for s in streams]
    reference = testing.load_reference_model(path)
    for prompt, final in zip(PROMPTS, finals, strict=True):
        assert [t.id for t in final.tokens] == hf_greedy(reference, prompt, NEW_TOKENS), family
    wait_idle(engine)


def test_expert_load_in_stats_equals_transformers_routing(tiny_checkpoints, xla_cache, engines):
    path = tiny_checkpoints("mixtral")
    engine = make_engine(path, xla_cache, **SMALL)
    engines.append(engine)
    prompt = PROMPTS[1]
    before = wait_idle(engine)  # no step yet: no expert keys
    final = list(engine.submit(GenerationRequest(prompt_ids=prompt, max_new_tokens=4)))[-1]
    stats = wait_idle(engine)
    seen = list(prompt) + [t.id for t in final.tokens][:-1]  # every token the model read
    reference = testing.load_reference_model(path)
    with torch.no_grad():
        routers = reference(torch.tensor([seen]), output_router_logits=True).router_logits
    picks = np.concatenate([torch.topk(r, 2, dim=-1).indices.numpy().ravel() for r in routers])
    expected = np.bincount(picks, minlength=4)
    routed = [stats[f"expert_{e}_total"] - before.get(f"expert_{e}_total", 0) for e in range(4)]
    assert routed == expected.tolist()
    assert (expected > 0).all(), "the prompt should route to every expert"
    last = [stats[f"expert_{e}_last_step"] for e in range(4)]
    assert sum(last) == 3 * 2  # one decode token, 3 layers, top-2
    assert stats["expert_imbalance"] == max(last) / (sum(last) / 4)
