"""The processors tgix builds where transformers cannot (no torchvision / num2words here or in
CI): the same prompt ids and pixels as the checkpoint's own processor."""

from __future__ import annotations

import numpy as np
from PIL import Image

from tgix import testing_vlm
from tgix.models.vision import serving


def test_idefics3_fallback_processor_equals_the_checkpoints(tmp_path, monkeypatch):
    import transformers

    path = testing_vlm.write_tiny_idefics3(tmp_path)
    own = transformers.AutoProcessor.from_pretrained(path)

    def refuse(*args, **kwargs):
        raise ImportError("torchvision")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", refuse)
    built = serving._idefics3_processor(path, testing_vlm.IMAGE_SEQ_LEN)
    assert type(built) is transformers.Idefics3Processor
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 24, 3), np.uint8))
    text = "<image>What is this?"
    a = own(text=[text], images=[[image]], return_tensors="np")
    b = built(text=[text], images=[[image]], return_tensors="np")
    assert a["input_ids"].tolist() == b["input_ids"].tolist()
    np.testing.assert_array_equal(a["pixel_values"], b["pixel_values"])
