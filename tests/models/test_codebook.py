"""4-bit codebooks at load time (`--quantize bitsandbytes-nf4 | bitsandbytes-fp4`): the books are
NF4's normal quantiles and bitsandbytes' FP4, each weight is its block's nearest book value
times the block's absmax (checked by brute force here), and the model's logits equal
transformers' on a checkpoint holding those dequantized weights (1e-4), on 1 and 2 shards."""

import numpy as np
import pytest
import torch

from tests.paged import prompt_then_tokens
from tgix import testing
from tgix.models import load_model
from tgix.models.quant_group import CODEBOOKS, codebook_group, quantize_codebook
from tgix.sharding import make_mesh
from tgix.testing_quant import write_roundtrip_twin

pytestmark = pytest.mark.reference


def test_the_books_are_nf4_and_bitsandbytes_fp4():
    nf4, fp4 = CODEBOOKS["nf4"], CODEBOOKS["fp4"]
    # QLoRA's published NF4 values (rounded)
    published = [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0910, 0.0,
                 0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0]  # fmt: skip
    np.testing.assert_allclose(nf4, published, atol=5e-5)
    assert (np.diff(nf4) > 0).all()
    # e2m1 with bias 3 and a 0.0625 subnormal, over 12: code 8*sign + 4*e1 + 2*e2 + m
    magnitudes = [0, 0.0625, 8, 12, 4, 6, 2, 3]
    np.testing.assert_array_equal(fp4[:8], np.float32(magnitudes) / np.float32(12))
    np.testing.assert_array_equal(fp4[8:], -fp4[:8])


@pytest.mark.parametrize("book", ["nf4", "fp4"])
def test_each_weight_is_its_blocks_nearest_book_value(book):
    w = np.random.default_rng(0).standard_normal((5, 128)).astype(np.float32)
    w[1, :64] = 0.0  # an all-zero block
    weight = quantize_codebook(w, book, 64)
    blocks = w.reshape(5, 2, 64)
    absmax = np.abs(blocks).max(-1)
    np.testing.assert_array_equal(weight.scale, np.where(absmax > 0, absmax, 1))
    scaled = blocks / weight.scale[..., None]
    distance = np.abs(scaled[..., None] - CODEBOOKS[book])  # [N, blocks, 64, 16]
    chosen = np.take_along_axis(distance, weight.codes.reshape(5, 2, 64, 1), -1)[..., 0]
    np.testing.assert_allclose(chosen, distance.min(-1), atol=1e-7)  # nearest (ties aside)
    want = CODEBOOKS[book][weight.codes].reshape(5, 2, 64) * weight.scale[..., None]
    np.testing.assert_array_equal(weight.dequantize(), want.reshape(5, 128))
    assert not weight.dequantize()[1, :64].any()
    assert codebook_group(128) == 64 and codebook_group(40) == 40 and codebook_group(96) == 48


@pytest.fixture(scope="module", params=["nf4", "fp4"])
def quantized(request, tiny_checkpoints, tmp_path_factory):
    """(checkpoint, method, transformers on its 4-bit-dequantized twin)."""
    src = tiny_checkpoints("llama")
    book = request.param
    roundtrip = lambda w: quantize_codebook(w, book, codebook_group(w.shape[1])).dequantize()
    dst = write_roundtrip_twin(src, tmp_path_factory.mktemp("deq") / book, roundtrip)
    return str(src), f"bitsandbytes-{request.param}", testing.load_reference_model(dst)


def test_logits_match_transformers_on_the_dequantized_weights(quantized):
    path, method, ref = quantized
    loaded = load_model(path, quantize=method)
    up = loaded.model.layers[0].mlp.up_proj
    assert loaded.quantize == method and up.kernel is None
    assert up.codes[...].shape == (56, 20) and up.grouped.codebook == method[-3:]
    rng = np.random.default_rng(1)
    prompt, continuation = rng.integers(3, 290, 15).tolist(), rng.integers(3, 290, 3).tolist()
    with torch.no_grad():
        full = ref(torch.tensor([prompt + continuation])).logits[0].numpy()
    np.testing.assert_allclose(
        prompt_then_tokens(loaded, prompt, continuation), full, atol=1e-4, rtol=0
    )


def test_two_shards_give_one_devices_logits(quantized):
    path, method, _ = quantized
    one = load_model(path, quantize=method, mesh=make_mesh(model=1))
    two = load_model(path, quantize=method, mesh=make_mesh(model=2))
    assert two.model.layers[0].mlp.down_proj.codes[...].sharding.spec[1] == "model"
    prompt = list(range(5, 16))
    np.testing.assert_allclose(
        prompt_then_tokens(two, prompt, [7]),
        prompt_then_tokens(one, prompt, [7]),
        atol=1e-4,
        rtol=0,
    )
