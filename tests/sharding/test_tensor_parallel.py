"""Tensor parallelism on 8 simulated CPU devices: every family gives the same logits (1e-4)
and greedy ids on 1 device and on each shard count its heads allow, with KV heads repeated
where the model axis is wider than K; parameters split evenly."""

import numpy as np
import pytest

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import load_model
from tgix.sharding import ShardingError, make_mesh

PROMPT = [5, 17, 42, 8, 99, 3, 250, 61, 7, 12, 130, 44, 9]
NEW_TOKENS = 6


def run(loaded):
    """All prefill logits [T, V], then greedy decode: (prefill logits, step logits, ids)."""
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=16)
    prefill = driver.step({"r": PROMPT}, num_tokens=16, all_logits=True)["r"]
    ids, steps = [int(np.argmax(prefill[-1]))], []
    for _ in range(NEW_TOKENS - 1):
        logits = driver.step({"r": [ids[-1]]})["r"]
        steps.append(logits)
        ids.append(int(np.argmax(logits)))
    driver.release("r")
    assert driver.free == list(range(15, 0, -1)) or sorted(driver.free) == list(range(1, 16))
    return prefill, np.stack(steps), ids


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_every_family_matches_one_device(tiny_checkpoints, family):
    path = str(tiny_checkpoints(family))
    one = run(load_model(path, mesh=make_mesh(model=1)))
    for shards, kv_heads in ((2, 2), (4, 4)):  # the tiny models have 4 query / 2 KV heads
        loaded = load_model(path, mesh=make_mesh(model=shards))
        assert loaded.config.num_kv_heads == kv_heads and loaded.checkpoint_kv_heads == 2
        prefill, steps, ids = run(loaded)
        np.testing.assert_allclose(prefill, one[0], atol=1e-4, rtol=0)
        np.testing.assert_allclose(steps, one[1], atol=1e-4, rtol=0)
        assert ids == one[2], (family, shards)
    with pytest.raises(ShardingError, match="over 8 devices; valid shard counts: 1, 2, 4$"):
        load_model(path, mesh=make_mesh(model=8))


@pytest.fixture(scope="module")
def eight_heads(tmp_path_factory):
    """8 query / 2 KV heads: every width up to 8, KV heads repeated 4x at 8."""
    overrides = {"num_attention_heads": 8, "hidden_size": 64, "head_dim": 8}
    return testing.write_tiny_checkpoint(
        "qwen2", tmp_path_factory.mktemp("eight"), overrides=overrides
    )


def test_eight_way_with_repeated_kv_heads(eight_heads):
    one = run(load_model(str(eight_heads)))
    loaded = load_model(str(eight_heads), num_shard=8)
    assert loaded.mesh.shape == {"data": 1, "model": 8}
    assert loaded.config.num_kv_heads == 8  # 2 checkpoint heads x 4 copies
    assert loaded.model.layers[0].self_attn.k_proj.weight[...].sharding.spec[0] == "model"
    prefill, steps, ids = run(loaded)
    np.testing.assert_allclose(prefill, one[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(steps, one[1], atol=1e-4, rtol=0)
    assert ids == one[2]


def per_device_bytes(loaded, device):
    """Bytes of every parameter's shard on `device`, and of the whole parameters."""
    from flax import nnx

    local = total = 0
    for leaf in nnx.to_flat_state(nnx.state(loaded.model, nnx.Param)):
        array = leaf[1][...]
        total += array.nbytes
        local += sum(s.data.nbytes for s in array.addressable_shards if s.device == device)
    return local, total


def test_parameters_split_evenly_over_the_model_axis(eight_heads):
    """Everything but the norms (a few hundred floats) is split: per device ~ total / 8."""
    loaded = load_model(str(eight_heads), num_shard=8)
    single = load_model(str(eight_heads))
    device = loaded.mesh.devices.flat[3]
    local, total = per_device_bytes(loaded, device)
    _, single_total = per_device_bytes(single, single.mesh.devices.flat[0])
    # k/v projections grow 4x (repeated heads); their shards equal one checkpoint head each
    cfg = loaded.config
    kv_growth = 2 * cfg.num_layers * (cfg.hidden_size + 1) * (8 - 2) * cfg.head_dim * 4  # +bias
    assert total == single_total + kv_growth
    norms = 4 * cfg.hidden_size * (2 * cfg.num_layers + 1)
    assert local == (total - norms) // 8 + norms
