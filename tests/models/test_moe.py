"""The MoE block alone: its three expert paths equal a per-expert loop (transformers' order)
on routings where every expert is picked and where some are never picked; the load counts
real tokens only; padding tokens change nothing."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tgix.models.config import ModelConfig
from tgix.models.moe import IMPLS, SparseMoE

E, D, F, TOP_K = 4, 12, 20, 2


def block(impl: str, *, shared: int = 0, renormalize: bool = True) -> SparseMoE:
    cfg = ModelConfig(
        model_type="mixtral", vocab_size=8, hidden_size=D, intermediate_size=F, num_layers=1,
        num_heads=2, num_kv_heads=2, head_dim=6, num_experts=E, experts_per_token=TOP_K,
        expert_size=F, norm_topk_prob=renormalize, moe_layers=(True,), shared_expert_size=shared,
    )  # fmt: skip
    moe = SparseMoE(cfg, rngs=nnx.Rngs(0), dtype=jnp.float32)
    moe.impl = impl
    return moe


def loop_reference(moe: SparseMoE, x: np.ndarray):
    """transformers' MixtralExperts.forward in numpy: each expert over its tokens, weighted."""
    router = np.asarray(moe.router[...])
    logits = x @ router.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :TOP_K]
    weights = np.take_along_axis(probs, top, -1)
    if moe.renormalize:
        weights /= weights.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    gate, up, down = (np.asarray(w[...]) for w in (moe.gate_kernel, moe.up_kernel, moe.down_kernel))
    for e in range(E):
        tokens, slot = np.nonzero(top == e)
        h = x[tokens] @ gate[e]
        h = h / (1 + np.exp(-h)) * (x[tokens] @ up[e])
        np.add.at(out, tokens, (h @ down[e]) * weights[tokens, slot][:, None])
    return out, np.bincount(top.ravel(), minlength=E)


def inputs(seed: int, t: int, *, only_first_two: bool, moe: SparseMoE) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((t, D)).astype(np.float32)
    if only_first_two:  # positive inputs, experts 0 and 1 pointing along them, 2 and 3 away
        x = np.abs(x)
        router = np.ones((E, D), np.float32) * np.array([[1.0], [0.9], [-1.0], [-0.9]])
        moe.router[...] = jnp.asarray(router)
    return x


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", [1, 5, 33])
@pytest.mark.parametrize("only_first_two", [False, True], ids=["all-experts", "two-unused"])
def test_every_path_equals_the_per_expert_loop(impl, t, only_first_two):
    moe = block(impl)
    x = inputs(t, t, only_first_two=only_first_two, moe=moe)
    expected, counts = loop_reference(moe, x)
    if only_first_two:
        assert counts.tolist() == [t, t, 0, 0]
    elif t == 33:
        assert (counts > 0).all(), "every expert should be picked by 33 random tokens"
    out, load = moe(jnp.asarray(x), jnp.int32(t))
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=0)
    assert np.asarray(load).tolist() == counts.tolist()


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_tokens_are_not_counted_and_change_nothing(impl):
    moe = block(impl, renormalize=False)
    x = inputs(7, 12, only_first_two=False, moe=moe)
    full, _ = moe(jnp.asarray(x), jnp.int32(12))
    out, load = moe(jnp.asarray(x), jnp.int32(9))  # the last 3 tokens are padding
    np.testing.assert_allclose(np.asarray(out)[:9], np.asarray(full)[:9], atol=1e-6, rtol=0)
    assert int(np.asarray(load).sum()) == 9 * TOP_K
    if impl == "sorted":  # padding is not computed at all
        assert not np.asarray(out)[9:].any()


def test_shared_expert_is_added_through_its_sigmoid_gate():
    moe = block("sorted", shared=8)
    x = np.random.default_rng(3).standard_normal((6, D)).astype(np.float32)
    routed, _ = loop_reference(moe, x)
    gate = 1 / (1 + np.exp(-(x @ np.asarray(moe.shared_expert_gate[...]).T)))  # [T, 1]
    shared = np.asarray(moe.shared_expert(jnp.asarray(x)))
    out, _ = moe(jnp.asarray(x), jnp.int32(6))
    np.testing.assert_allclose(np.asarray(out), routed + gate * shared, atol=1e-5, rtol=0)
