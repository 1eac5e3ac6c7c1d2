"""Loading safetensors folders: shards, dtypes, and a clear error for every broken checkpoint."""

import json
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import CheckpointError, load_model


def first_logits(loaded, prompt=(5, 17, 42, 99, 3, 250), num_pages=8, **driver_options):
    driver = PagedDriver(
        loaded.model, loaded.config, loaded.mesh, num_pages=num_pages, **driver_options
    )
    logits = driver.step({"r": list(prompt)}, all_logits=True)["r"]
    driver.release("r")
    assert len(driver.free) == num_pages - 1  # every page back (page 0 is the null page)
    return logits


@pytest.fixture
def broken(tiny_checkpoints, tmp_path):
    """A writable copy of the tiny llama checkpoint, with its tensors as a dict to edit."""
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints("llama"), folder)
    tensors = load_file(folder / "model.safetensors")

    def save(new_tensors):
        save_file(new_tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return str(folder)

    return tensors, save


def test_missing_tensor_is_named(broken):
    tensors, save = broken
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        CheckpointError, match=r"lacks 1 tensor\(s\): layers\.1\.mlp\.up_proj\.(weight|kernel)"
    ):
        load_model(save(tensors))


def test_extra_tensor_is_named(broken):
    tensors, save = broken
    tensors["model.layers.0.mlp.extra_proj.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.extra_proj"
    ):
        load_model(save(tensors))


def test_tensor_for_a_layer_the_config_lacks(broken):
    tensors, save = broken
    tensors["model.layers.7.input_layernorm.weight"] = np.ones(40, np.float32)
    with pytest.raises(CheckpointError, match=r"this config has no layers\.7\.input_layernorm"):
        load_model(save(tensors))


def test_wrong_shape_is_named(broken):
    tensors, save = broken
    tensors["model.layers.2.self_attn.k_proj.weight"] = np.zeros((30, 40), np.float32)
    with pytest.raises(
        CheckpointError, match=r"'model\.layers\.2\.self_attn\.k_proj\.weight' has shape \(30, 40\)"
    ):
        load_model(save(tensors))
    tensors["model.layers.2.self_attn.k_proj.weight"] = np.zeros((32, 40), np.float32)
    tensors["model.norm.weight"] = np.ones(41, np.float32)
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has shape \(41,\)"):
        load_model(save(tensors))


def test_pickle_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(testing.tiny_hf_config("llama")))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(
        CheckpointError, match=r"only pickled weights \(pytorch_model\.bin\).*safetensors"
    ):
        load_model(str(tmp_path))


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(str(tmp_path))


def test_sharded_checkpoint_with_index_matches_single_file(tiny_checkpoints, tmp_path):
    sharded = testing.write_tiny_checkpoint("llama", tmp_path / "sharded", sharded=True)
    assert len(list(sharded.glob("*.safetensors"))) >= 2
    assert (sharded / "model.safetensors.index.json").exists()
    single = first_logits(load_model(str(tiny_checkpoints("llama"))))
    np.testing.assert_array_equal(first_logits(load_model(str(sharded))), single)


def test_missing_shard_is_named(tmp_path):
    sharded = testing.write_tiny_checkpoint("llama", tmp_path / "sharded", sharded=True)
    victim = sorted(sharded.glob("*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"shard {victim.name} listed"):
        load_model(str(sharded))


def test_bfloat16_checkpoint_loads_into_float32(broken):
    import ml_dtypes

    tensors, save = broken
    reference = first_logits(
        load_model(
            save({k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in tensors.items()})
        )
    )
    loaded = load_model(save({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}))
    assert loaded.model.embed_tokens.embedding[...].dtype == np.float32
    np.testing.assert_array_equal(first_logits(loaded), reference)


def test_parameters_are_placed_on_the_mesh(tiny_checkpoints):
    from tgix.sharding import make_mesh

    mesh = make_mesh(model=2, devices=jax.devices()[:2])
    loaded = load_model(str(tiny_checkpoints("llama")), mesh=mesh)
    q = loaded.model.layers[0].self_attn.q_proj.weight[...]  # [N*H, D] (CPU: out-major)
    assert q.sharding.spec == jax.sharding.PartitionSpec("model", None)
    assert {s.data.shape for s in q.addressable_shards} == {(2 * 16, 40)}
