"""Test support for vision-language checkpoints: a tiny random Idefics3 / SmolVLM folder with
its processor (tokenizer, image processor, chat template), readable offline by transformers'
AutoProcessor and from_pretrained. torch/transformers are imported lazily.

The tiny shapes: vision hidden 32, 2 layers, 4 heads, patches of 4 on 32x32 tiles (8x8
patches), scale_factor 2, so 16 `<image>` tokens per tile; images are resized to a longest
edge of 64 and split into 32x32 tiles (1x2, 2x1 or 2x2, plus the global tile). Text model:
Llama, hidden 64, 2 layers, 4 heads, 2 KV heads, vocab = the tokenizer's length.
"""

from __future__ import annotations

import pathlib

from tgix import testing

IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
ROW_COL_TOKENS = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))

# SmolVLM's template (images only): "<|im_start|>User:<image>text<end_of_utterance>\n...".
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

VISION_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "patch_size": 4,
    "image_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
TEXT_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
}
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (VISION_CONFIG["image_size"] // VISION_CONFIG["patch_size"]) ** 2 // (
    SCALE_FACTOR**2
)
_CLASSES = {
    "idefics3": ("Idefics3Config", "Idefics3ForConditionalGeneration"),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration"),
}


def _tokenizer():
    """The test BPE (tgix.testing) plus the processor's special tokens; eos <end_of_utterance>."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=testing._train_tokenizer(),
        bos_token=testing.SPECIAL_TOKENS[testing.BOS_ID],
        eos_token="<end_of_utterance>",
        pad_token=testing.SPECIAL_TOKENS[testing.PAD_ID],
        unk_token=None,
        additional_special_tokens=list(IMAGE_TOKENS + ROW_COL_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_tiny_idefics3(
    path,
    *,
    seed: int = 0,
    model_type: str = "idefics3",
    vision: dict | None = None,
    text: dict | None = None,
    scale_factor: int = SCALE_FACTOR,
    longest_edge: int | None = None,
) -> pathlib.Path:
    """Save a random tiny Idefics3ForConditionalGeneration (or SmolVLMForConditionalGeneration
    for model_type "smolvlm"; float32 safetensors) and an Idefics3Processor beside it. The
    processor is Idefics3Processor for both (SmolVLMProcessor needs num2words and a video
    processor; its image prompts are the same). config.image_token_id is `<image>`'s id.
    `vision` / `text` override fields of the tiny configs and `longest_edge` the processor's
    resize target (default: two tiles' width), for benchmarks at real shapes."""
    import torch
    import transformers
    from transformers import Idefics3Processor
    from transformers.models.idefics3 import image_processing_pil_idefics3

    path = pathlib.Path(path)
    config_class, model_class = (getattr(transformers, n) for n in _CLASSES[model_type])
    tokenizer = _tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<image>", "<end_of_utterance>")}
    special = {
        "bos_token_id": testing.BOS_ID,
        "eos_token_id": ids["<end_of_utterance>"],
        "pad_token_id": testing.PAD_ID,
    }
    text_config = {**TEXT_CONFIG, **(text or {}), "vocab_size": len(tokenizer), **special}
    vision_config = {**VISION_CONFIG, **(vision or {})}
    config = config_class(
        vision_config=vision_config,
        text_config=text_config,
        scale_factor=scale_factor,
        image_token_id=ids["<image>"],
        tie_word_embeddings=False,
        **special,
    )
    config.architectures = [model_class.__name__]
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32).eval()
    testing._reinit_(model, seed)
    model.save_pretrained(path, safe_serialization=True)

    tile = vision_config["image_size"]
    image_processor = image_processing_pil_idefics3.Idefics3ImageProcessorPil(
        size={"longest_edge": longest_edge or 2 * tile},
        max_image_size={"longest_edge": tile},
        do_image_splitting=True,
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(tile // vision_config["patch_size"]) ** 2 // scale_factor**2,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    return path


def load_reference_vlm(path):
    """transformers' model for ``path`` (Idefics3 or SmolVLM): float32, eval, eager attention."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()
