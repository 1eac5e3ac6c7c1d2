"""The tiny test checkpoints' configs: each family's transformers config class and the fields
over a shared base (tgix/testing.py writes them). Plain data: imports nothing heavy."""

from __future__ import annotations

from typing import Any

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

_BASE = {
    "vocab_size": 320,
    "hidden_size": 40,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 56,
    "num_hidden_layers": 3,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

# family -> (transformers config class name, overrides on top of _BASE)
_FAMILY_OVERRIDES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama3": ("LlamaConfig", {"rope_parameters": _LLAMA3_ROPE}),
    "llama32": ("LlamaConfig", {"rope_parameters": _LLAMA3_ROPE, "tie_word_embeddings": True}),
    "llama_bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "llama_linear": (
        "LlamaConfig",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "llama_dynamic": (
        "LlamaConfig",
        {
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
            "max_position_embeddings": 16,
        },
    ),
    "llama_yarn": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                # 64 puts the YaRN ramp over dims 0..3 of the 8 frequencies: some are blended
                "original_max_position_embeddings": 64,
            },
            "max_position_embeddings": 256,
        },
    ),
    "smollm": (
        "LlamaConfig",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
            "tie_word_embeddings": True,
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": 5}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": False, "sliding_window": None}),
    "qwen3": (
        "Qwen3Config",
        {"attention_bias": False, "use_sliding_window": False, "sliding_window": None},
    ),
}

LLAMA_FAMILIES: tuple[str, ...] = tuple(_FAMILY_OVERRIDES)  # the Llama-shaped ones above

_GEMMA = {
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "sliding_window": 5,
    "query_pre_attn_scalar": 24,  # a scale of 24^-0.5, not head_dim^-0.5
    "tie_word_embeddings": True,
}
_MOE = {"num_experts_per_tok": 2}
_FAMILY_OVERRIDES.update(
    {
        # caps small enough that tanh bends the scores and the logits
        "gemma2": (
            "Gemma2Config",
            {**_GEMMA, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 3.0},
        ),
        "gemma3": (
            "Gemma3TextConfig",
            {
                **_GEMMA,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            },
        ),
        "phi3": ("Phi3Config", {"sliding_window": 7}),
        # Phi-4-mini's shape: LongRoPE over half of each head; prompts cross the switch at 16
        "phi3_longrope": (
            "Phi3Config",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "short_factor": [1.0, 1.1, 1.3, 1.6],
                    "long_factor": [1.2, 2.0, 3.5, 6.0],
                },
                "original_max_position_embeddings": 16,
                "hidden_size": 64,  # Phi3Config checks the factors against D // N, not H
            },
        ),
        "mixtral": ("MixtralConfig", {**_MOE, "num_local_experts": 4}),
        "qwen3_moe": (
            "Qwen3MoeConfig",
            {
                **_MOE,
                "num_experts": 4,
                "moe_intermediate_size": 24,
                "norm_topk_prob": False,
                "mlp_only_layers": [1],  # a dense layer between sparse ones
                "use_sliding_window": False,
                "sliding_window": None,
            },
        ),
        # 6 experts: an expert axis over 2 devices, tensor-parallel experts over 4
        "qwen2_moe": (
            "Qwen2MoeConfig",
            {
                **_MOE,
                "num_experts": 6,
                "moe_intermediate_size": 24,
                "shared_expert_intermediate_size": 32,
                "norm_topk_prob": True,
                "use_sliding_window": False,
                "sliding_window": None,
            },
        ),
    }
)

FAMILIES: tuple[str, ...] = tuple(_FAMILY_OVERRIDES)
NEW_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f not in LLAMA_FAMILIES)
# Speculation and Medusa tests: drafts and their verification do not depend on the family
# once the forward matches transformers (the parity tests, every family), except through
# what a verify step changes per token: dynamic rope and LongRoPE's switch (tokenwise), the
# sliding window (alternating with global layers in gemma3), soft-capped scores, tied heads
# and biases, and an MoE's routing of k+1 tokens a row (mixtral).
SPECULATION_FAMILIES: tuple[str, ...] = (
    "llama_dynamic", "mistral", "smollm", "qwen2", "phi3_longrope", "gemma2", "gemma3",
    "mixtral",
)  # fmt: skip
