"""A vision-language model's prompt side as the engine serves it: the processor, the
compiled encoder and (M-RoPE models) the position rows, per checkpoint type, put together
as one tgix.engine.vision_inputs.VisionPrompts."""

from __future__ import annotations

import numpy as np

START_PATCHES = 1024  # Qwen2.5-VL: patch buckets compiled at start-up (larger: on first use)


def vision_prompts(loaded, tokenizer, *, compile: bool):
    """VisionPrompts for `loaded` (a LoadedModel with a vision side), or None."""
    from tgix.engine.vision_inputs import VisionPrompts

    if loaded.vision is None:
        return None
    kind, path = loaded.vision_model_type, loaded.files.path
    rope = None
    if kind == "qwen2_5_vl":
        processor, encode, rope = _qwen(loaded.vision, path, compile=compile)
    else:
        from tgix.models.vision.encoder import ImageEncoder

        processor = _idefics3_processor(path, loaded.vision.config.tokens_per_tile)
        encode = ImageEncoder(loaded.vision)
        if compile:
            encode.compile_all()
    image_token = processor.image_token
    ids = tokenizer.encode(image_token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the image token {image_token!r} is not one token")
    tokenizer.image_token = image_token  # chat templates write it for each image
    return VisionPrompts(
        processor, encode, image_token=image_token, image_token_id=ids[0], rope=rope
    )


def _idefics3_processor(path, image_seq_len: int):
    """The checkpoint's processor; where transformers cannot build it (SmolVLMProcessor wants
    num2words and torchvision for its video half) an Idefics3Processor over the same image
    processor and tokenizer, whose image prompts are SmolVLM's."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, Idefics3Processor

    try:
        return AutoProcessor.from_pretrained(path)
    except (ImportError, AttributeError, ValueError):
        tokenizer = AutoTokenizer.from_pretrained(path)
        return Idefics3Processor(
            image_processor=AutoImageProcessor.from_pretrained(path),
            tokenizer=tokenizer,
            image_seq_len=image_seq_len,
            chat_template=tokenizer.chat_template,
        )


def _qwen(vision, path, *, compile: bool):
    """Qwen2.5-VL: transformers' processor where it loads, else ExpandingProcessor; the
    tower compiled per patch-count bucket (qwen_encoder.py) up to one image's pixel budget
    (at most START_PATCHES); M-RoPE rows per prompt."""
    from tgix.models.vision.qwen2_5_vl_rope import mrope_position_ids
    from tgix.models.vision.qwen_encoder import QwenImageEncoder
    from tgix.models.vision.qwen_processor import ExpandingProcessor

    cfg = vision.cfg
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path)
    except (ImportError, AttributeError, ValueError):  # no torchvision: no video processor
        processor = ExpandingProcessor.from_pretrained(path, cfg.spatial_merge_size)
    image_processor = processor.image_processor
    most = getattr(image_processor, "max_pixels", None) or image_processor.size["longest_edge"]
    encode = QwenImageEncoder(vision, max_patches=min(START_PATCHES, most // cfg.patch_size**2))
    if compile:
        encode.compile_all()

    def rope(ids: np.ndarray, pixels: dict):
        return mrope_position_ids(ids, pixels["image_grid_thw"], cfg)

    return processor, encode, rope
