"""Qwen2.5-VL's vision tower and M-RoPE positions vs transformers (float32, tiny random
checkpoint from tgix/testing_qwen_vl.py), on random images through the saved processor."""

import json
import shutil

import numpy as np
import pytest
import torch

from tgix.models.checkpoint import CheckpointError
from tgix.models.vision.qwen2_5_vl import encode_images, load_qwen25_vision, vision_inputs
from tgix.models.vision.qwen2_5_vl_rope import mrope_cos_sin, mrope_position_ids
from tgix.testing_qwen_vl import load_reference_vl, write_tiny_qwen25_vl

Image = pytest.importorskip("PIL.Image", reason="transformers' image processor needs pillow")
pytestmark = pytest.mark.reference
ATOL = 1e-4

# (height, width) of each image: landscape, portrait, wide, square, tall; merged grids that
# split into several windows (some partial), fit windows exactly, or are one window.
CASES = {
    "1-image": [(24, 40)],
    "2-images": [(32, 16), (60, 20)],
    "3-images": [(24, 48), (20, 20), (40, 24)],
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_qwen25_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def reference(checkpoint):
    return load_reference_vl(checkpoint)


@pytest.fixture(scope="module")
def vision(checkpoint):
    return load_qwen25_vision(checkpoint)


def _messages(count: int) -> list[dict]:
    """Text before, between and after the images."""
    content = [{"type": "text", "text": "Look at these pictures:"}]
    for i in range(count):
        content += [{"type": "image"}, {"type": "text", "text": f" and {i}" if i else " then"}]
    content.append({"type": "text", "text": " What is the time?"})
    return [{"role": "user", "content": content}]


def _process(path, images) -> dict[str, np.ndarray]:
    """The processor's outputs for one chat with `images`: AutoProcessor where transformers
    can build it (its video processor needs torchvision), else the same steps by hand: the
    saved image processor, the chat template, each image pad expanded to its tokens."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    messages = _messages(len(images))
    try:
        processor = AutoProcessor.from_pretrained(str(path))
    except ImportError:
        processor = None
    if processor is not None:
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = processor(images=images, text=[text], return_tensors="np")
        return {k: np.asarray(out[k]) for k in out}
    pixels = AutoImageProcessor.from_pretrained(str(path))(images=images, return_tensors="np")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(images) + 1
    counts = [int(np.prod(g)) // 4 for g in pixels["image_grid_thw"]]
    text = pieces[0] + "".join(
        "<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:], strict=True)
    )
    input_ids = np.asarray([tokenizer(text)["input_ids"]])
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return {
        "input_ids": input_ids,
        "mm_token_type_ids": (input_ids == image_id).astype(np.int64),
        "pixel_values": np.asarray(pixels["pixel_values"]),
        "image_grid_thw": np.asarray(pixels["image_grid_thw"]),
    }


@pytest.fixture(scope="module", params=list(CASES))
def case(request, checkpoint):
    rng = np.random.default_rng(len(request.param))
    images = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for h, w in CASES[request.param]
    ]
    return _process(checkpoint, images)


def test_image_embeddings_match_transformers(case, reference, vision):
    pixel_values, grid = case["pixel_values"], case["image_grid_thw"]
    assert len({tuple(g) for g in grid}) == len(grid), "images of different sizes"
    with torch.no_grad():
        features = reference.get_image_features(
            torch.tensor(pixel_values), torch.tensor(grid)
        ).pooler_output
    expected = torch.cat(features).numpy()
    ours = np.asarray(encode_images(vision, pixel_values, grid))
    assert ours.shape == expected.shape == (len(pixel_values) // 4, 64)
    assert expected.std() > 0.3, "weights too small for a meaningful comparison"
    np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0)


def test_vision_inputs_match_transformers(case, vision):
    from transformers.vision_utils import (
        get_vision_cu_seqlens,
        get_vision_position_ids,
        get_vision_window_index,
    )

    grid = torch.tensor(case["image_grid_thw"])
    cfg = vision.cfg
    ours = vision_inputs(case["image_grid_thw"], cfg)
    index, cu_windows = get_vision_window_index(grid, 2, cfg.window_size, cfg.patch_size)
    assert len(cu_windows) > len(grid) + 1, "windows split the images"
    np.testing.assert_array_equal(ours["window_index"], index.numpy())
    np.testing.assert_array_equal(ours["cu_window_seqlens"], cu_windows.numpy())
    np.testing.assert_array_equal(ours["cu_seqlens"], get_vision_cu_seqlens(grid).numpy())
    positions = get_vision_position_ids(grid, 2).numpy().reshape(-1, 4, 2)[index.numpy()]
    np.testing.assert_array_equal(ours["position_ids"], positions.reshape(-1, 2))


def test_mrope_positions_match_get_rope_index(case, reference, vision):
    input_ids = case["input_ids"][0]
    is_image = input_ids == vision.cfg.image_token_id
    assert not is_image[0] and not is_image[-1], "text before and after the images"
    expected, deltas = reference.model.get_rope_index(
        torch.tensor(case["input_ids"]),
        mm_token_type_ids=torch.tensor(case["mm_token_type_ids"]),
        image_grid_thw=torch.tensor(case["image_grid_thw"]),
    )
    positions, delta = mrope_position_ids(input_ids, case["image_grid_thw"], vision.cfg)
    np.testing.assert_array_equal(positions, expected[:, 0].numpy())
    assert delta == int(deltas[0, 0]) < 0


def test_mrope_cos_sin_match_transformers(case, reference, vision):
    positions, _ = mrope_position_ids(case["input_ids"][0], case["image_grid_thw"], vision.cfg)
    rotary = reference.model.language_model.rotary_emb
    x = torch.zeros(1, positions.shape[1], 64)
    with torch.no_grad():
        cos, sin = rotary(x, torch.tensor(positions)[:, None, :])
    section = tuple(reference.config.text_config.rope_parameters["mrope_section"])
    ours = mrope_cos_sin(positions, rotary.inv_freq.numpy(), section)
    np.testing.assert_allclose(np.asarray(ours[0]), cos[0].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(ours[1]), sin[0].numpy(), atol=1e-6, rtol=0)


def test_mrope_text_only_and_errors(vision):
    cfg = vision.cfg
    positions, delta = mrope_position_ids(np.arange(3, 10), None, cfg)
    np.testing.assert_array_equal(positions, np.tile(np.arange(7), (3, 1)))
    assert delta == 0
    ids = np.array([5, cfg.vision_start_token_id] + [cfg.image_token_id] * 5 + [6])
    with pytest.raises(ValueError, match="5 image tokens for images of 6"):
        mrope_position_ids(ids, np.array([[1, 4, 6]]), cfg)
    with pytest.raises(NotImplementedError, match="video"):
        mrope_position_ids(np.array([5, cfg.video_token_id]), None, cfg)


def test_load_names_missing_tensor(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    assert any(n.startswith("visual.") for n in tensors), "transformers 5 saves visual.*"
    del tensors["visual.blocks.2.attn.qkv.bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    shutil.copy(checkpoint / "config.json", tmp_path / "config.json")
    with pytest.raises(
        CheckpointError, match=r"missing 1 tensor\(s\) \['visual.blocks.2.attn.qkv.bias'\]"
    ):
        load_qwen25_vision(tmp_path)
    shutil.copy(checkpoint / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((checkpoint / "config.json").read_text())
    config["vision_config"]["depth"] = 3  # the checkpoint's block 3 fits no parameter
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"missing 0 .* unexpected 12 .*blocks\.3\.attn"):
        load_qwen25_vision(tmp_path)


def test_auto_processor_loads(checkpoint):
    pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(checkpoint))
    config = json.loads((checkpoint / "config.json").read_text())
    assert processor.image_token_id == config["image_token_id"]
    assert processor.image_processor.patch_size == 4
