"""GGUF blocks kept quantized: each kept type (Q8_0, Q4_0, Q4_1, Q4_K) reads into groups that
dequantize bit-equal to `gguf.quants.dequantize`; a model whose linear weights stay in blocks
gives the dequantized model's logits (1e-4) on 1 and 2 shards, holding 4-bit codes two per
byte; the default model's Q4_1 file does the same with 4.4x fewer weight bytes."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GGML

from tests.paged import PagedDriver
from tgix import testing, testing_quant
from tgix.models import load_model
from tgix.models.gguf_blocks import layout_of, read_blocks
from tgix.sharding import make_mesh

# widths that are multiples of 32 (one GGUF block), split in whole blocks over 2 shards
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16}
TYPES = {
    "q_proj": "Q4_0", "k_proj": "Q4_1", "v_proj": "Q8_0", "o_proj": "Q4_1",
    "gate_proj": "Q4_0", "up_proj": "Q8_0", "down_proj": "Q4_1",
}  # fmt: skip


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_written_blocks_dequantize_as_gguf_does(type_name):
    w = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    w[2, :32] = 0.0  # a block of zeros
    blocks = gguf.quants.quantize(w, GGML[type_name])
    weight = read_blocks(blocks, type_name, 96)
    assert weight.layout == layout_of(type_name) and weight.codes.shape == (6, 96)
    want = gguf.quants.dequantize(blocks, GGML[type_name]).reshape(6, 96)
    np.testing.assert_array_equal(weight.dequantize(), want)


def test_q4_k_super_blocks_dequantize_as_gguf_does():
    """Random Q4_K bytes (every 6-bit scale/min pattern) with sane fp16 d and dmin."""
    rng = np.random.default_rng(1)
    rows, cols = 5, 512
    blocks = rng.integers(0, 256, (rows, cols // 256, 144)).astype(np.uint8)
    for at in (0, 2):  # d, dmin
        half = rng.uniform(1e-3, 0.1, (rows, cols // 256)).astype(np.float16)
        blocks[..., at : at + 2] = half.view(np.uint8).reshape(rows, cols // 256, 2)
    data = blocks.reshape(rows, -1)
    weight = read_blocks(data, "Q4_K", cols)
    assert weight.scale.shape == (rows, cols // 32) and weight.offset is not None
    want = gguf.quants.dequantize(data, GGML.Q4_K).reshape(rows, cols)
    np.testing.assert_array_equal(weight.dequantize(), want)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    base = testing.write_tiny_checkpoint(
        "llama", tmp_path_factory.mktemp("float"), seed=4, overrides=SHAPE
    )
    return str(
        testing_quant.write_gguf(base, tmp_path_factory.mktemp("gguf") / "m.gguf", types=TYPES)
    )


def logits(loaded, prompt=(5, 17, 42, 99, 3, 250, 7, 8, 9)):
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=8)
    out = [driver.step({"r": list(prompt)}, num_tokens=16, all_logits=True)["r"]]
    out.append(driver.step({"r": [int(np.argmax(out[0][-1]))]})["r"][None])
    driver.release("r")
    assert len(driver.free) == 7
    return np.concatenate(out)


def test_kept_blocks_give_the_dequantized_models_logits(mixed_gguf):
    kept = load_model(mixed_gguf, quantize_form="kept")
    dequantized = load_model(mixed_gguf, quantize_form="float")
    assert (kept.quantize_form, dequantized.quantize_form) == ("kept", "float")
    layer = kept.model.layers[1]
    assert layer.self_attn.q_proj.codes[...].shape == (64, 32)  # Q4_0: two codes per byte
    assert layer.mlp.up_proj.codes[...].shape == (128, 64)  # Q8_0: a byte per code
    assert layer.mlp.down_proj.offset is not None and layer.mlp.down_proj.zero is None  # Q4_1
    float_q = dequantized.model.layers[1].self_attn.q_proj
    assert float_q.codes is None and (float_q.kernel, float_q.weight) != (None, None)
    assert kept.weight_bytes < dequantized.weight_bytes
    np.testing.assert_allclose(logits(kept), logits(dequantized), atol=1e-4, rtol=0)


def test_kept_blocks_on_two_shards_give_one_devices_logits(mixed_gguf):
    one = load_model(mixed_gguf, quantize_form="kept", mesh=make_mesh(model=1))
    two = load_model(mixed_gguf, quantize_form="kept", mesh=make_mesh(model=2))
    o_proj = two.model.layers[0].self_attn.o_proj  # codes [D, N*H / 2]: contracted axis split
    assert o_proj.codes[...].sharding.spec[1] == "model"
    np.testing.assert_allclose(logits(two), logits(one), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_default_model_kept_in_its_q4_1_blocks():
    """The default model's 210 Q4_1 linear weights stay in blocks: its logits are the
    dequantized model's, from far fewer bytes (the Q8_0 embedding and tied head stay float)."""
    kept = load_model(quantize_form="kept")
    dequantized = load_model(quantize_form="float")
    assert dequantized.weight_bytes / kept.weight_bytes > 1.5
    prompt = (1, 504, 3458, 314, 260, 1789, 30, 2)
    np.testing.assert_allclose(logits(kept, prompt), logits(dequantized, prompt), atol=1e-3, rtol=0)
