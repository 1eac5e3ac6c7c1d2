"""ModelConfig.from_hf: every Hugging Face quirk it normalises, and the errors it raises."""

import pytest

from tgix.models.config import ModelConfig, UnsupportedModelError, yarn_attention_factor

BASE = {
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 40,
    "intermediate_size": 56,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
}


def cfg(**overrides):
    return ModelConfig.from_hf({**BASE, **overrides})


def test_defaults_fill_kv_heads_head_dim_and_rope():
    c = cfg()
    assert (c.num_kv_heads, c.head_dim, c.group_size) == (4, 10, 1)
    assert (c.rope.rope_type, c.rope.theta) == ("default", 10000.0)
    assert c.sliding_windows == (None, None, None)
    assert not (c.tie_word_embeddings or c.qkv_bias or c.o_bias or c.mlp_bias or c.qk_norm)
    assert c.eos_token_ids == ()


def test_explicit_head_dim_and_gqa():
    c = cfg(num_key_value_heads=2, head_dim=16)
    assert (c.num_kv_heads, c.head_dim, c.group_size) == (2, 16, 2)


def test_rope_theta_top_level_or_in_rope_parameters():
    assert cfg(rope_theta=500000.0).rope.theta == 500000.0
    assert cfg(rope_parameters={"rope_type": "default", "rope_theta": 1e6}).rope.theta == 1e6


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_llama3_scaling_from_either_key(key):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    rope = cfg(**{key: scaling}, rope_theta=500000.0).rope
    assert (rope.rope_type, rope.factor, rope.original_max_position, rope.theta) == (
        "llama3",
        8.0,
        8192,
        500000.0,
    )


def test_legacy_type_key_linear_and_dynamic():
    assert cfg(rope_scaling={"type": "linear", "factor": 2.0}).rope.rope_type == "linear"
    dyn = cfg(rope_scaling={"type": "dynamic", "factor": 4.0}).rope
    assert (dyn.rope_type, dyn.factor) == ("dynamic", 4.0)


def test_yarn_fields_and_attention_factor():
    rope = cfg(
        max_position_embeddings=4096,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    ).rope
    assert rope.original_max_position == 1024
    assert yarn_attention_factor(rope) == pytest.approx(0.1 * __import__("math").log(4) + 1)
    explicit = cfg(
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "attention_factor": 0.5,
            "original_max_position_embeddings": 16,
        }
    ).rope
    assert yarn_attention_factor(explicit) == 0.5


def test_tied_embeddings_biases_and_eos_list():
    c = cfg(tie_word_embeddings=True, attention_bias=True, mlp_bias=True, eos_token_id=[7, 9])
    assert c.tie_word_embeddings and c.qkv_bias and c.o_bias and c.mlp_bias
    assert c.eos_token_ids == (7, 9)
    assert cfg(eos_token_id=3).eos_token_ids == (3,)


def test_family_switches():
    qwen2 = cfg(model_type="qwen2")
    assert qwen2.qkv_bias and not qwen2.o_bias
    assert cfg(model_type="qwen3").qk_norm


def test_sliding_window_per_family():
    assert cfg(model_type="mistral", sliding_window=4096).sliding_windows == (4096,) * 3
    assert cfg(model_type="mistral", sliding_window=None).sliding_windows == (None,) * 3
    # Qwen2 ignores sliding_window unless use_sliding_window; then layers >= max_window_layers.
    assert cfg(model_type="qwen2", sliding_window=8).sliding_windows == (None,) * 3
    qwen = cfg(model_type="qwen2", sliding_window=8, use_sliding_window=True, max_window_layers=1)
    assert qwen.sliding_windows == (None, 8, 8)
    typed = cfg(
        sliding_window=8, layer_types=["full_attention", "sliding_attention", "full_attention"]
    )
    assert typed.sliding_windows == (None, 8, None)


def test_max_position_and_text_config_nesting():
    assert cfg(max_position_embeddings=8192).max_position == 8192
    nested = ModelConfig.from_hf({"model_type": "llama", "text_config": {**BASE}})
    assert nested.hidden_size == 40


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope type 'longrope'"),
        ({"rope_scaling": {"rope_type": "linear"}}, "needs ['factor']"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}}, "beta_fast"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"layer_types": ["full_attention"], "sliding_window": 4}, "layer_types has 1"),
    ],
)
def test_unsupported_options_name_themselves(overrides, message):
    with pytest.raises(UnsupportedModelError) as err:
        cfg(**overrides)
    assert message in str(err.value)
