"""tgix's Idefics3 / SmolVLM vision side vs transformers (PyTorch, float32) on tiny random
checkpoints (tgix/testing_vlm.py): image features through the saved processor, the NaViT
position ids and patch masks, padding tiles and images, and the loader's checks."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from tgix import testing_vlm
from tgix.models.checkpoint import CheckpointError
from tgix.models.vision.idefics3 import (
    Idefics3VisionConfig,
    image_features,
    load_idefics3_vision,
    patch_inputs,
    real_images,
)

pytestmark = pytest.mark.reference
ATOL = 1e-4
SIZES = {"wide": (40, 24), "tall": (17, 61), "square": (64, 64)}  # PIL (width, height)
TILES = {"wide": 5, "tall": 3, "square": 5}  # 2x2 + global, 2 rows x 1 col + global


def _images(names, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for w, h in (SIZES[n] for n in names)
    ]


class Setup:
    def __init__(self, path):
        from transformers import AutoProcessor

        self.path = path
        self.config = json.loads((path / "config.json").read_text())
        self.ref = testing_vlm.load_reference_vlm(path)
        self.processor = AutoProcessor.from_pretrained(path)
        self.vision = load_idefics3_vision(path)

    def reference(self, pixel_values, pixel_attention_mask):
        with torch.no_grad():
            out = self.ref.model.get_image_features(
                torch.as_tensor(pixel_values), torch.as_tensor(pixel_attention_mask)
            )
        return torch.cat(list(out.pooler_output)).numpy()

    def check(self, inputs):
        """tgix's features equal transformers'; one per `<image>` token of the prompts."""
        pixels, mask = (
            np.asarray(inputs["pixel_values"]),
            np.asarray(inputs["pixel_attention_mask"]),
        )
        ours = image_features(self.vision, pixels, mask)
        expected = self.reference(pixels, mask)
        assert expected.std() > 0.5, "weights too small for a meaningful comparison"
        np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0)
        num_tokens = int((np.asarray(inputs["input_ids"]) == self.config["image_token_id"]).sum())
        assert ours.shape == (num_tokens, self.config["text_config"]["hidden_size"])


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    return Setup(testing_vlm.write_tiny_idefics3(tmp_path_factory.mktemp("idefics3")))


def _prompt(n_images: int) -> list[dict]:
    content = [{"type": "image"} for _ in range(n_images)] + [
        {"type": "text", "text": "What is this?"}
    ]
    return [{"role": "user", "content": content}]


def test_checkpoint_and_processor(idefics3):
    cfg, tok = idefics3.config, idefics3.processor.tokenizer
    assert cfg["image_token_id"] == tok.convert_tokens_to_ids("<image>")
    assert cfg["text_config"]["vocab_size"] == len(tok)
    vcfg = Idefics3VisionConfig.from_hf(cfg)
    assert (vcfg.num_patches_per_side, vcfg.tokens_per_tile, vcfg.text_hidden_size) == (8, 16, 64)
    text = idefics3.processor.apply_chat_template(_prompt(2), add_generation_prompt=True)
    assert text == "<|im_start|>User:<image><image>What is this?<end_of_utterance>\nAssistant:"
    for name, tiles in TILES.items():
        inputs = idefics3.processor(text=["<image>"], images=[_images([name])])
        assert np.asarray(inputs["pixel_values"]).shape == (1, tiles, 3, 32, 32)
        ids = np.asarray(inputs["input_ids"][0])
        assert (ids == cfg["image_token_id"]).sum() == 16 * tiles
    from safetensors import safe_open

    with safe_open(str(idefics3.path / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert {"lm_head.weight", "model.text_model.embed_tokens.weight"} <= names
    assert "model.text_model.layers.0.self_attn.q_proj.weight" in names
    assert all(n.startswith(("model.vision_model.", "model.connector.", "model.text_model."))
               for n in names - {"lm_head.weight"})  # fmt: skip


@pytest.mark.parametrize(
    "names", [["wide"], ["tall", "square"], ["wide", "tall", "square"]], ids="-".join
)
def test_image_features_through_chat_template(idefics3, names):
    messages = _prompt(len(names))
    for part, image in zip(messages[0]["content"], _images(names), strict=False):
        part["image"] = image
    inputs = idefics3.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="np"
    )
    assert np.asarray(inputs["pixel_values"]).shape[1] == sum(TILES[n] for n in names)
    idefics3.check(inputs)


def test_batch_with_padding_images(idefics3):
    """Two prompts, 3 and 10 tiles: the first is padded with 7 all-zero images."""
    images = [_images(["tall"], seed=1), _images(["wide", "square"], seed=2)]
    inputs = idefics3.processor(
        text=["<image>first", "<image>and<image>second"], images=images, padding=True
    )
    pixels = np.asarray(inputs["pixel_values"])
    assert pixels.shape[:2] == (2, 10)
    assert (
        real_images(pixels.reshape(-1, 3, 32, 32)).tolist()
        == [True] * 3 + [False] * 7 + [True] * 10
    )
    idefics3.check(inputs)


def _hooked_position_ids(embeddings, run):
    captured = []
    handle = embeddings.position_embedding.register_forward_hook(
        lambda module, args, out: captured.append(args[0].numpy())
    )
    try:
        run()
    finally:
        handle.remove()
    (ids,) = captured
    return ids


def test_partially_padded_tiles(idefics3):
    """Hand-made masks (valid top-left regions of 32x32, 13x27 and 32x5 pixels, then a
    padding tile): features and transformers' own position ids equal ours."""
    rng = np.random.default_rng(3)
    pixels = rng.standard_normal((1, 4, 3, 32, 32)).astype(np.float32)
    pixels[0, 3] = 0.0
    mask = np.zeros((1, 4, 32, 32), np.int64)
    for i, (h, w) in enumerate([(32, 32), (13, 27), (32, 5)]):
        mask[0, i, :h, :w] = 1
    embeddings = idefics3.ref.model.vision_model.embeddings
    expected = _hooked_position_ids(embeddings, lambda: idefics3.reference(pixels, mask))
    position_ids, patch_mask = patch_inputs(pixels[0, :3], mask[0, :3], 4, 8)
    np.testing.assert_array_equal(position_ids, expected)
    assert patch_mask.sum(1).tolist() == [64, 4 * 7, 8 * 2]
    ours = image_features(idefics3.vision, pixels, mask)
    np.testing.assert_allclose(ours, idefics3.reference(pixels, mask), atol=ATOL, rtol=0)


@pytest.mark.parametrize("side", [19, 26, 27, 32])
def test_position_ids_match_bucketize(side):
    """Every valid-region size on grids of 19 (where torch.arange's float32 rounding shifts a
    bucket), 26 (Idefics3), 27 (SmolVLM 2B) and 32 (SmolVLM 256M/500M) patches per side."""
    from transformers.models.idefics3 import modeling_idefics3

    patch = 2
    config = modeling_idefics3.Idefics3VisionConfig(
        hidden_size=4, image_size=side * patch, patch_size=patch
    )
    embeddings = modeling_idefics3.Idefics3VisionEmbeddings(config)
    rng = np.random.default_rng(side)
    rows = np.concatenate([np.arange(1, side + 1), rng.integers(1, side + 1, side)])
    cols = np.concatenate([np.arange(1, side + 1)[::-1], rng.integers(1, side + 1, side)])
    pixel_mask = np.zeros((len(rows), side * patch, side * patch), bool)
    for i, (r, c) in enumerate(zip(rows, cols, strict=True)):
        pixel_mask[i, : r * patch - i % 2, : c * patch - i % 2] = True  # some patches partial
    pixels = np.zeros((len(rows), 3, side * patch, side * patch), np.float32)
    grid = torch.as_tensor(pixel_mask).unfold(1, patch, patch).unfold(2, patch, patch)
    patch_mask = grid.sum(dim=(-1, -2)) > 0  # as Idefics3Model.get_image_features
    expected = _hooked_position_ids(
        embeddings, lambda: embeddings(torch.as_tensor(pixels), patch_mask)
    )
    position_ids, ours_mask = patch_inputs(pixels, pixel_mask, patch, side)
    np.testing.assert_array_equal(ours_mask, patch_mask.reshape(len(rows), -1).numpy())
    np.testing.assert_array_equal(position_ids, expected)


def test_smolvlm(tmp_path_factory):
    setup = Setup(testing_vlm.write_tiny_idefics3(tmp_path_factory.mktemp("smolvlm"), seed=1,
                                                  model_type="smolvlm"))  # fmt: skip
    assert setup.config["model_type"] == "smolvlm"
    assert type(setup.ref).__name__ == "SmolVLMForConditionalGeneration"
    names = ["square", "wide", "tall"]
    inputs = setup.processor(text=["<image>a<image>b<image>c"], images=[_images(names, seed=4)])
    setup.check(inputs)


def test_loader_names_and_errors(idefics3, tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(idefics3.path / "model.safetensors"))
    bare = tmp_path / "bare"  # an Idefics3Model's names: no "model." prefix
    bare.mkdir()
    shutil.copy(idefics3.path / "config.json", bare)
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, bare / "model.safetensors")
    vision = load_idefics3_vision(bare)
    inputs = idefics3.processor(text=["<image>"], images=[_images(["wide"])])
    args = np.asarray(inputs["pixel_values"]), np.asarray(inputs["pixel_attention_mask"])
    np.testing.assert_array_equal(
        image_features(vision, *args), image_features(idefics3.vision, *args)
    )

    lacking = tmp_path / "lacking"
    lacking.mkdir()
    shutil.copy(idefics3.path / "config.json", lacking)
    del tensors["model.vision_model.encoder.layers.1.mlp.fc2.bias"]
    save_file(tensors, lacking / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.fc2\.bias"):
        load_idefics3_vision(lacking)
