"""ExLlamaV2 (exl2) checkpoints: every bit width's codes unpack bit-equal to the format's
definition (tgix.testing_exl2 packs them as ExLlamaV2's kernel does and computes the
definition from the codes before packing), logits equal transformers' on those weights in the
float and kept forms, greedy ids equal, and sharding is refused as TGI refuses it."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from tests.models.test_prequant import quantized_reads_equal
from tests.paged import PagedDriver, greedy, prompt_then_tokens
from tgix import testing, testing_exl2
from tgix.models import QuantizeError, load_model
from tgix.models.checkpoint import CheckpointError, SafetensorsSource
from tgix.models.exl2 import read_exl2
from tgix.models.prequant import PrequantizedSource, read_spec
from tgix.sharding import make_mesh

pytestmark = pytest.mark.reference
# decoder widths multiples of 32, as real models' are; the vocabulary (300) is not: the LM
# head's columns are padded to 320 with zero codes
SHAPE = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(exl2 folder, float reference folder)."""
    root = tmp_path_factory.mktemp("exl2")
    base = testing.write_tiny_checkpoint("llama", root / "float", seed=4, overrides=SHAPE)
    testing_exl2.write_exl2_checkpoint(base, root / "q", reference=root / "ref")
    return root / "q", root / "ref"


def source_of(path, *, kept, vocab_size=300):
    config = json.loads((path / "config.json").read_text())
    spec = read_spec(config, path)
    return PrequantizedSource(SafetensorsSource(path), spec, kept=kept, vocab_size=vocab_size)


def ids(seed, n):
    return np.random.default_rng(seed).integers(3, 290, size=n).tolist()


def test_unpacked_weights_equal_the_format_definition(checkpoint):
    path, ref_path = checkpoint
    for kept in (False, True):
        quantized = quantized_reads_equal(source_of(path, kept=kept), ref_path)
        assert quantized == (3 * 7 if kept else 0)  # the LM head is read as float


def test_every_bit_width_and_a_group_ending_mid_word_are_read(checkpoint):
    """Across the layers: all six widths; odd decoder layers end in 16 rows of 6 bits (3 words)
    and 16 of 3 bits (2 words, the second half empty), read as groups of gcd 16 inputs; the
    LM head has one 64-row group."""
    path, _ = checkpoint
    tensors = load_file(path / "model.safetensors")
    source = source_of(path, kept=True)
    widths, mid_word = set(), 0
    for name in (n for n in tensors if n.endswith(".q_groups")):
        layer = name[: -len(".q_groups")]
        groups = tensors[name].reshape(-1, 2)
        widths |= set(groups[:, 0].tolist())
        weight = source.read_grouped(layer)
        assert weight.layout.perm and weight.codes.shape[1] == len(tensors[f"{layer}.q_invperm"])
        if groups[-1, 0] == 3 and groups[-2, 0] == 6:
            mid_word += 1
            assert groups[-1, 1] - groups[-2, 1] == 3
            assert tensors[f"{layer}.q_weight"].shape[0] - groups[-1, 1] == 2
            assert weight.layout.group == 16
        else:
            assert weight.layout.group == (64 if layer == "lm_head" else 32)
    assert widths == {2, 3, 4, 5, 6, 8} and mid_word == 10  # of 21 decoder layers


def test_a_hand_packed_column_reads_back():
    """One column, 3 bits: codes 0..7 then 7..0 for 32 rows cross word boundaries at rows
    10 and 21; a scale code s gives (s + 1)^2 * max / 256 in float16; no permutation."""
    codes = np.array(list(range(8)) * 2 + list(range(7, -1, -1)) * 2, np.uint64)
    stream = sum(int(c) << (3 * i) for i, c in enumerate(codes))
    words = np.array([[(stream >> (32 * j)) & 0xFFFFFFFF] for j in range(3)], np.uint32)
    q_scale = np.array([[3 | (15 << 4) | (1 << 28)]], np.uint32).view(np.int32)
    padded = np.repeat(words, 8, axis=1)  # 8 columns share the codes; scale codes 3, 15, .., 1
    maximum = np.array([2.0], np.float16)
    weight = read_exl2(padded.view(np.int32), np.array([3, 0], np.int16), q_scale, maximum)
    assert weight.perm is None and weight.codes.shape == (8, 32)
    np.testing.assert_array_equal(weight.codes[0], codes)
    np.testing.assert_array_equal(weight.zero, 4.0)
    want = np.array([16, 256, 1, 1, 1, 1, 1, 4]) / 128
    np.testing.assert_array_equal(weight.scale[:, 0], want)
    with pytest.raises(CheckpointError, match="columns 6..8 are not zero padding"):
        read_exl2(padded.view(np.int32), [3, 0], q_scale, maximum, out_features=6)


def test_padded_head_columns_are_cut_and_a_checkpoint_without_config_is_recognised(
    checkpoint, tmp_path
):
    """ExLlamaV2 pads N to a multiple of 32 with zero codes (the 300-token head to 320) and,
    before v0.0.16, wrote no quantization_config: its q_invperm tensors say what it is."""
    path, ref_path = checkpoint
    assert load_file(path / "model.safetensors")["lm_head.q_weight"].shape[1] == 320
    padded = source_of(path, kept=False, vocab_size=None).read("lm_head.weight")
    want = load_file(ref_path / "model.safetensors")["lm_head.weight"]
    np.testing.assert_array_equal(padded[:300], want)
    np.testing.assert_array_equal(padded[300:], 0.0)
    old = shutil.copytree(path, tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    del config["quantization_config"]
    (old / "config.json").write_text(json.dumps(config))
    assert load_model(str(old)).quantize == "exl2"


@pytest.mark.parametrize("form", ["float", "kept"])
def test_logits_match_transformers_on_the_dequantized_weights(checkpoint, form):
    path, ref_path = checkpoint
    loaded = load_model(str(path), quantize_form=form)
    assert (loaded.quantize, loaded.quantize_form) == ("exl2", form)
    proj = loaded.model.layers[1].mlp.gate_proj
    assert (proj.kernel is None and proj.weight is None) == (form == "kept")
    prompt, continuation = ids(1, 17), ids(2, 3)
    with torch.no_grad():
        full = testing.load_reference_model(ref_path)(torch.tensor([prompt + continuation]))
    full = full.logits[0].numpy()
    assert full.std() > 0.5
    got = prompt_then_tokens(loaded, prompt, continuation)
    np.testing.assert_allclose(got, full, atol=1e-4, rtol=0)


def test_greedy_ids_equal_transformers_generate(checkpoint):
    path, ref_path = checkpoint
    loaded = load_model(str(path), quantize_form="kept")
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=24)
    prompt = ids(5, 9)
    with torch.no_grad():
        want = testing.load_reference_model(ref_path).generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False
        )
    assert greedy(driver, prompt, 12, bucket=16) == want[0, len(prompt) :].tolist()
    assert len(driver.free) == 23


def test_sharding_and_contradicting_flags_are_refused(checkpoint):
    path, ref_path = checkpoint
    with pytest.raises(QuantizeError, match="Sharding is currently not supported with `exl2`"):
        load_model(str(path), mesh=make_mesh(model=2))
    with pytest.raises(QuantizeError, match=r"`--quantize gptq` contradicts .* `exl2`"):
        load_model(str(path), quantize="gptq")
    with pytest.raises(QuantizeError, match=r"`--quantize exl2` reads a pre-quantized"):
        load_model(str(ref_path), quantize="exl2")
    assert load_model(str(path), quantize="exl2").quantize == "exl2"
