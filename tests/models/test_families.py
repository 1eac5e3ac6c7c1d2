"""Each family's config.json as the Hub has it (transformers 4.x and 5.x spellings) -> the
ModelConfig switches; what a family cannot serve is refused by name; stacked experts load
completely or name the missing ones; shard counts follow heads, MLP and experts."""

import json

import numpy as np
import pytest

from tgix import testing
from tgix.models import CheckpointError, load_model
from tgix.models.config import ModelConfig, UnsupportedModelError
from tgix.sharding.rules import expert_axis, valid_shard_counts

BASE = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip


def cfg(model_type, **fields) -> ModelConfig:
    return ModelConfig.from_hf({**BASE, "model_type": model_type, **fields})


def test_gemma2_as_transformers_4_wrote_it():
    c = cfg(
        "gemma2", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
    )  # fmt: skip
    assert c.sliding_windows == (4096, None) * 3  # even layers slide
    assert (c.attn_scale, c.attn_softcap, c.final_softcap) == (256**-0.5, 50.0, 30.0)
    assert (c.hidden_act, c.norm_plus_one, c.sandwich_norms, c.qk_norm) == (
        "gelu_tanh", True, True, False,
    )  # fmt: skip
    assert c.embed_scale == 8.0 and c.tie_word_embeddings and c.local_rope is None


def test_gemma3_text_local_and_global_ropes_both_spellings():
    old = cfg(
        "gemma3_text", hidden_activation="gelu_pytorch_tanh", rope_theta=1e6,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=10000.0,
        sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=16,
    )  # fmt: skip
    assert old.sliding_windows == (512,) * 5 + (None,)
    assert (old.rope.rope_type, old.rope.theta, old.rope.factor) == ("linear", 1e6, 8.0)
    assert (old.local_rope.rope_type, old.local_rope.theta) == ("default", 10000.0)
    assert old.qk_norm and old.attn_softcap is None
    new = ModelConfig.from_hf(testing.tiny_hf_config("gemma3"))
    assert new.sliding_windows == (5, None, 5)
    assert (new.rope.rope_type, new.rope.theta, new.local_rope.theta) == ("linear", 1e6, 1e4)


def test_gemma3_with_a_vision_tower_is_refused_by_name():
    with pytest.raises(UnsupportedModelError, match="vision tower.*gemma3_text"):
        ModelConfig.from_hf({"model_type": "gemma3", "text_config": {**BASE}})


def test_gemma_needs_its_activation():
    with pytest.raises(UnsupportedModelError, match="hidden_act 'silu' is not supported for gem"):
        cfg("gemma2", hidden_activation="silu")


def test_phi3_su_is_longrope_and_partial_rotary_is_phi3s_only():
    factors = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    c = cfg(
        "phi3", rope_scaling={"type": "su", **factors}, partial_rotary_factor=0.5,
        original_max_position_embeddings=4096, max_position_embeddings=131072,
    )  # fmt: skip
    assert (c.rope.rope_type, c.rope.original_max_position, c.rotary_dim) == ("longrope", 4096, 8)
    assert c.rope.factor == 32.0 and c.rope.long_factor == (2.0,) * 4
    with pytest.raises(UnsupportedModelError, match="short_factor has 4 entries for rotary dim 16"):
        cfg("phi3", rope_scaling={"type": "longrope", **factors}, max_position_embeddings=8)
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor.*for llama"):
        cfg("llama", partial_rotary_factor=0.5)
    assert cfg("phi3", sliding_window=2047).sliding_windows == (2047,) * 6
    yarn = cfg(
        "phi3", rope_scaling={"type": "yarn", **factors}, partial_rotary_factor=0.5,
        original_max_position_embeddings=4096,
    )  # fmt: skip
    assert yarn.rope.rope_type == "longrope"  # as Phi3Config reads it


def test_moe_switches_per_family():
    mixtral = cfg("mixtral", num_local_experts=8, num_experts_per_tok=2)
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.expert_size) == (8, 2, 96)
    assert mixtral.norm_topk_prob and mixtral.moe_layers == (True,) * 6
    qwen3 = cfg(
        "qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        decoder_sparse_step=2, mlp_only_layers=[5],
    )  # fmt: skip
    assert qwen3.moe_layers == (False, True, False, True, False, False)
    assert qwen3.qk_norm and not qwen3.norm_topk_prob and qwen3.expert_size == 32
    qwen2 = cfg(
        "qwen2_moe", num_experts=6, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, norm_topk_prob=False,
    )  # fmt: skip
    assert (qwen2.shared_expert_size, qwen2.qkv_bias, qwen2.norm_topk_prob) == (64, True, False)


def test_qwen_moe_sliding_windows_are_refused_by_name():
    with pytest.raises(UnsupportedModelError, match="use_sliding_window.*qwen3_moe"):
        cfg("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
            use_sliding_window=True, sliding_window=64)  # fmt: skip


def test_gemma_without_head_dim_or_rope_theta_takes_its_defaults():
    fields = {k: v for k, v in BASE.items() if k != "head_dim"}
    c = ModelConfig.from_hf({**fields, "model_type": "gemma3_text",
                             "hidden_activation": "gelu_pytorch_tanh"})  # fmt: skip
    assert (c.head_dim, c.attn_scale, c.rope.theta, c.local_rope.theta) == (16, 0.25, 1e6, 1e4)


def test_shard_counts_follow_experts_or_their_width():
    c = cfg("qwen2_moe", num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=32)  # fmt: skip
    assert valid_shard_counts(c) == [1, 2, 4]  # 3: 4 heads do not split
    assert expert_axis(c, 2) and not expert_axis(c, 4)  # 6 experts over 2; width 24 over 4
    narrow = cfg("mixtral", num_local_experts=3, num_experts_per_tok=2, intermediate_size=6)
    assert valid_shard_counts(narrow) == [1, 2]  # neither 3 experts nor width 6 split by 4


@pytest.fixture(scope="module")
def mixtral_folder(tiny_checkpoints):
    return tiny_checkpoints("mixtral")


def test_a_missing_expert_is_named(mixtral_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(mixtral_folder / "model.safetensors"))
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((mixtral_folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.up_kernel\[2\]"):
        load_model(str(tmp_path))


def test_a_quantized_moe_checkpoint_is_refused_at_start(mixtral_folder, tmp_path):
    from tgix import testing_quant
    from tgix.models import QuantizeError

    path = testing_quant.write_awq_checkpoint(mixtral_folder, tmp_path / "awq")
    with pytest.raises(QuantizeError, match="mixtral: quantized experts are not supported"):
        load_model(str(path))


def test_stacked_host_arrays_are_let_go_once_placed(mixtral_folder, monkeypatch):
    """The loader keeps no reference (not even a view) to an [E, ...] host array once its
    last expert is in, so each goes as soon as the device has it."""
    from tgix.models import weights

    seen, real_finish = {}, weights._Placer.finish

    def finish(self):
        seen.update(self.stacks)
        return real_finish(self)

    monkeypatch.setattr(weights._Placer, "finish", finish)
    load_model(str(mixtral_folder))
    assert len(seen) == 3 * 3  # 3 layers x gate/up/down
    assert all(host is None and len(filled) == 4 for host, filled in seen.values())


def test_stacked_experts_hold_the_checkpoint_tensors(mixtral_folder):
    from safetensors.numpy import load_file

    tensors = load_file(str(mixtral_folder / "model.safetensors"))
    mlp = load_model(str(mixtral_folder)).model.layers[2].mlp
    for e in range(4):
        w1 = tensors[f"model.layers.2.block_sparse_moe.experts.{e}.w1.weight"]
        np.testing.assert_array_equal(np.asarray(mlp.gate_kernel[...][e]), w1.T)
    assert json.loads((mixtral_folder / "config.json").read_text())["num_local_experts"] == 4
