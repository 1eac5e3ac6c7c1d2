"""Test support: a tiny random Qwen2.5-VL checkpoint (Qwen2_5_VLForConditionalGeneration,
float32) with its processor files (Qwen2_5_VLProcessor: Qwen2VLImageProcessor sized for a few
dozen 4-pixel patches an image, the test BPE plus Qwen's vision tokens, Qwen's chat template).

The processor files are written as transformers 5's save_pretrained lays them out
(processor_config.json holding the image and video processors' dicts), not by constructing
Qwen2_5_VLProcessor: transformers builds its video processor only with torchvision, which this
project does not install. With torchvision, AutoProcessor.from_pretrained(path) loads them; without
it, AutoImageProcessor and AutoTokenizer do (the image processor's PIL backend).

torch/transformers are imported lazily so this module imports without them.
"""

from __future__ import annotations

import json
import pathlib

from tgix.testing import BOS_ID, EOS_ID, PAD_ID, _reinit_, write_test_tokenizer

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE, TEMPORAL_PATCH = 4, 2, 2
MIN_PIXELS = (PATCH * MERGE) ** 2 * 4  # 16 patches
MAX_PIXELS = (PATCH * MERGE) ** 2 * 16  # 64 patches

# Qwen2-VL / Qwen2.5-VL's chat template: image and video parts as vision_start, the pad token
# (the processor expands it to the image's tokens), vision_end.
QWEN_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_VISION = {
    "depth": 4,
    "fullatt_block_indexes": [1, 3],
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 4,  # head_dim 8: rope over 2 frequencies a spatial axis
    "in_channels": 3,
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL_PATCH,
    "spatial_merge_size": MERGE,
    "window_size": 16,  # pixels: 2 x 2 merged tokens a window, so images split into windows
    "out_hidden_size": 64,
    "hidden_act": "silu",
}
_TEXT = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head_dim 16: mrope_section sums to 8
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}


def _write_tokenizer(path: pathlib.Path) -> dict[str, int]:
    """The test BPE plus the vision tokens and Qwen's template; -> token -> id."""
    from transformers import AutoTokenizer

    write_test_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(path))
    return dict(
        zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(list(VISION_TOKENS)), strict=True)
    )


def _write_processor(path: pathlib.Path) -> None:
    """processor_config.json (+ chat_template.jinja) as Qwen2_5_VLProcessor.save_pretrained
    writes it."""
    shared = {
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],  # OPENAI_CLIP_MEAN / STD
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,  # bicubic
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL_PATCH,
        "merge_size": MERGE,
    }
    config = {
        "processor_class": "Qwen2_5_VLProcessor",
        "image_processor": {**shared, "image_processor_type": "Qwen2VLImageProcessor"},
        "video_processor": {
            **shared,
            "video_processor_type": "Qwen2VLVideoProcessor",
            "do_sample_frames": False,
        },
    }
    (path / "processor_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (path / "chat_template.jinja").write_text(QWEN_VL_CHAT_TEMPLATE)


def write_tiny_qwen25_vl(path, *, seed: int = 0) -> pathlib.Path:
    """Save a random tiny Qwen2.5-VL (safetensors, float32), its tokenizer and processor."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = _write_tokenizer(path)
    config = Qwen2_5_VLConfig(
        text_config=json.loads(json.dumps(_TEXT)),
        vision_config=dict(_VISION),
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32).eval()
    _reinit_(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    _write_processor(path)
    return path


def load_reference_vl(path):
    """transformers' Qwen2_5_VLForConditionalGeneration for ``path``: float32, eval, eager."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()
