"""GGUF loading: a tiny checkpoint written the way llama.cpp's converter writes it loads back to
the same logits as its safetensors original; quantized tensors dequantize; bad files fail."""

import gguf
import numpy as np
import pytest

from tests.paged import PagedDriver
from tgix import testing_quant
from tgix.models import CheckpointError, UnsupportedModelError, load_model
from tgix.models.gguf import hf_name, unpermute_rope_rows
from tgix.testing_quant import llama_cpp_permute


def write_gguf(folder, out_path, *, quantize_o=False):
    return testing_quant.write_gguf(
        folder, out_path, types={"o_proj": "Q8_0"} if quantize_o else None
    )


def logits(model_id, prompt=(5, 17, 42, 99, 3, 250, 7, 8, 9)):
    loaded = load_model(model_id)
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=8)
    out = driver.step({"r": list(prompt)}, all_logits=True)["r"]
    driver.release("r")
    return out


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(6 * 16 * 5).reshape(6 * 16, 5).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(w, 6), 6), w)
    assert not np.array_equal(llama_cpp_permute(w, 6), w)


def test_name_map():
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(CheckpointError, match="'blk.0.ffn_gate_exps.weight' has no tgix mapping"):
        hf_name("blk.0.ffn_gate_exps.weight")


def test_float32_gguf_equals_safetensors(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints("llama")
    path = write_gguf(folder, tmp_path / "tiny.gguf")
    np.testing.assert_allclose(logits(str(path)), logits(str(folder)), atol=1e-5, rtol=0)


def test_quantized_tensor_is_dequantized(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints("llama")
    path = write_gguf(folder, tmp_path / "q8.gguf", quantize_o=True)
    ours, exact = logits(str(path)), logits(str(folder))
    difference = np.abs(ours - exact).max()
    assert 0 < difference < 0.05 * np.abs(exact).max()  # Q8_0 error: small, not zero


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not gguf")
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        load_model(str(bad))


def test_unsupported_architecture(tmp_path):
    writer = gguf.GGUFWriter(tmp_path / "x.gguf", "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'gpt2'"):
        load_model(str(tmp_path / "x.gguf"))
