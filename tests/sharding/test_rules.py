"""Which layouts a model allows, and the start-up errors for the ones it does not."""

import dataclasses

import jax
import pytest

from tgix.models.config import ModelConfig
from tgix.sharding import (
    ShardingError,
    check_fits,
    kv_repeats,
    make_mesh,
    mesh_for_model,
    spec_for,
    valid_shard_counts,
)

SMOLLM2_135M = ModelConfig(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
)


def test_kv_heads_repeat_when_the_model_axis_is_a_multiple():
    assert [kv_repeats(2, s) for s in (1, 2, 4, 8)] == [1, 1, 2, 4]
    assert kv_repeats(8, 4) == 1
    assert kv_repeats(3, 2) == 0  # neither divides: no layout
    assert kv_repeats(4, 6) == 0


def test_valid_counts_follow_query_heads_kv_heads_and_mlp_width():
    assert valid_shard_counts(SMOLLM2_135M) == [1, 3]
    llama8b = dataclasses.replace(
        SMOLLM2_135M, num_heads=32, num_kv_heads=8, intermediate_size=14336
    )
    assert valid_shard_counts(llama8b) == [1, 2, 4, 8, 16, 32]
    assert valid_shard_counts(llama8b, limit=8) == [1, 2, 4, 8]


def test_invalid_count_is_refused_naming_the_counts_and_the_valid_ones():
    with pytest.raises(ShardingError) as err:
        check_fits(SMOLLM2_135M, make_mesh(model=2))
    assert str(err.value) == (
        "cannot shard 9 query heads, 3 KV heads and MLP width 1536 over 2 devices; "
        "valid shard counts: 1, 3"
    )
    with pytest.raises(ShardingError, match="over 16 devices; valid shard counts: 1, 3$"):
        mesh_for_model(SMOLLM2_135M, 16)  # the heads speak before the device count
    llama8b = dataclasses.replace(
        SMOLLM2_135M, num_heads=32, num_kv_heads=8, intermediate_size=14336
    )
    with pytest.raises(ShardingError, match="needs 16 devices; 8 are visible"):
        mesh_for_model(llama8b, 16)


def test_unset_count_takes_the_widest_layout_on_the_visible_devices():
    assert jax.device_count() == 8
    assert mesh_for_model(SMOLLM2_135M, None).shape == {"data": 1, "model": 3}
    assert mesh_for_model(SMOLLM2_135M, 3).shape == {"data": 1, "model": 3}
    wide = dataclasses.replace(SMOLLM2_135M, num_heads=8, num_kv_heads=2, intermediate_size=64)
    assert mesh_for_model(wide, None).shape == {"data": 1, "model": 8}
    assert mesh_for_model(wide, None, data=2).shape == {"data": 2, "model": 4}


def test_vocabulary_splits_only_when_it_divides():
    assert spec_for(("vocab", "embed"), (49152, 576), 3) == jax.P("model", None)
    assert spec_for(("vocab", "embed"), (49153, 576), 3) == jax.P(None, None)
    assert spec_for(("embed", "heads", "head_dim")) == jax.P(None, "model", None)
