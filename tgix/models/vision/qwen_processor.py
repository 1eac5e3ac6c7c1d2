"""Qwen2.5-VL's prompt processing where transformers cannot build its processor (in
transformers 5, Qwen2_5_VLProcessor needs a video processor, which needs torchvision): the
checkpoint's own image processor (transformers' Qwen2VLImageProcessor: resize to the pixel
budget, patches, normalisation) and tokenizer, with the processor's one rule applied here:
each `<|image_pad|>` becomes t * h * w / merge**2 of them, the image's merged grid. Host only.
"""

from __future__ import annotations

import numpy as np


class ExpandingProcessor:
    """The slice of a transformers processor that tgix uses: `__call__(text=[s],
    images=[[...]], return_tensors="np", add_special_tokens=...)`, `tokenizer`,
    `image_token`, `apply_chat_template`."""

    def __init__(self, image_processor, tokenizer, *, image_token: str, merge_size: int):
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = image_token
        self.merge_size = merge_size

    @classmethod
    def from_pretrained(cls, path, merge_size: int) -> ExpandingProcessor:
        from transformers import AutoImageProcessor, AutoTokenizer

        return cls(
            AutoImageProcessor.from_pretrained(str(path)),
            AutoTokenizer.from_pretrained(str(path)),
            image_token="<|image_pad|>",
            merge_size=merge_size,
        )

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    def __call__(self, *, text, images, return_tensors="np", add_special_tokens=True):
        (prompt,), (pictures,) = text, images
        pixels = self.image_processor(images=list(pictures), return_tensors="np")
        grids = np.asarray(pixels["image_grid_thw"])
        pieces = prompt.split(self.image_token)
        if len(pieces) != len(grids) + 1:
            raise ValueError(f"{len(pieces) - 1} image tokens for {len(grids)} images")
        counts = [int(np.prod(g)) // self.merge_size**2 for g in grids]
        expanded = pieces[0] + "".join(
            self.image_token * n + piece for n, piece in zip(counts, pieces[1:], strict=True)
        )
        ids = np.asarray(
            [self.tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]]
        )
        image_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        return {
            "input_ids": ids,
            "mm_token_type_ids": (ids == image_id).astype(np.int64),  # 1: an image token
            "pixel_values": np.asarray(pixels["pixel_values"]),
            "image_grid_thw": grids,
        }
