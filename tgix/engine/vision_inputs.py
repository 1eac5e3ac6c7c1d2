"""A vision-language prompt's host side (no jax): transformers' processor turns the prompt text
(with the model's image token where each image goes) and the decoded images into input ids
and pixel arrays; the model's image encoder (device, a callable) turns the pixels into the
embeddings that replace the image tokens in the decoder (GenerationRequest.images).

The processor is the model's own (resize, tiling, normalisation, the image-token expansion),
so the prompt ids equal transformers'. It runs in the server's validation pool, like the
tokenizer; `encode` is thread-safe (tgix/models/vision/: compiled per tile or patch bucket).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

import numpy as np

from tgix.engine.request import ImageSpans


class ImagePromptError(ValueError):
    """The prompt and its images do not fit together (shown to the client as a 422)."""


class VisionPrompts:
    """`processor`: the model's transformers processor; `encode(pixels: dict) -> [N, D]
    float32`, the image features in the order of the image tokens; `image_token` is the
    processor's placeholder text (e.g. `<image>`) and `image_token_id` the id every
    expanded image position carries. `rope(ids, pixels) -> (positions [3, L], delta)`: an
    M-RoPE model's (time, height, width) position rows of the prompt (Qwen2.5-VL)."""

    def __init__(
        self,
        processor,
        encode: Callable[[dict], np.ndarray],
        *,
        image_token: str,
        image_token_id: int,
        rope: Callable[[np.ndarray, dict], tuple[np.ndarray, int]] | None = None,
    ):
        self.processor = processor
        self.encode = encode
        self.image_token = image_token
        self.image_token_id = image_token_id
        self.rope = rope
        self._lock = threading.Lock()
        self.images = 0  # images encoded so far
        self.encode_seconds = 0.0

    def prepare(
        self, text: str, images: list, *, add_special_tokens: bool = True
    ) -> tuple[tuple[int, ...], ImageSpans | None]:
        """(prompt ids, their ImageSpans) for `text` holding one `image_token` per image."""
        found = text.count(self.image_token)
        if found != len(images):
            raise ImagePromptError(
                f"the prompt has {found} image placeholders for {len(images)} images"
            )
        if not images:
            ids = self.processor.tokenizer(text, add_special_tokens=add_special_tokens)
            return tuple(ids["input_ids"]), None
        batch = self.processor(
            text=[text], images=[images], return_tensors="np", add_special_tokens=add_special_tokens
        )
        ids = np.asarray(batch["input_ids"][0], np.int64)
        pixels = {k: np.asarray(v) for k, v in batch.items() if k not in _TEXT_KEYS}
        start = time.perf_counter()
        embeds = np.asarray(self.encode(pixels), np.float32)
        elapsed = time.perf_counter() - start
        positions = np.flatnonzero(ids == self.image_token_id).astype(np.int32)
        if len(positions) != len(embeds):
            raise ImagePromptError(
                f"{len(positions)} image tokens in the prompt for {len(embeds)} image features"
            )
        digest = hashlib.blake2b(digest_size=16)
        for key in sorted(pixels):
            digest.update(key.encode() + np.ascontiguousarray(pixels[key]).tobytes())
        with self._lock:
            self.images += len(images)
            self.encode_seconds += elapsed
        rope_positions, rope_delta = None, 0
        if self.rope is not None:
            rope_positions, rope_delta = self.rope(ids, pixels)
            rope_positions = np.asarray(rope_positions, np.int32)
        spans = ImageSpans(
            positions=positions,
            embeds=embeds,
            digest=digest.hexdigest(),
            count=len(images),
            rope_positions=rope_positions,
            rope_delta=int(rope_delta),
        )
        return tuple(int(i) for i in ids), spans


_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
