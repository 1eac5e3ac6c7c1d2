"""GGUF loading: a tiny checkpoint written the way llama.cpp's converter writes it loads back to
the same logits as its safetensors original; quantized tensors dequantize; bad files fail."""

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import CheckpointError, UnsupportedModelError, load_model
from tgix.models.gguf import hf_name, unpermute_rope_rows

TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


GLOBAL_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's HF->GGUF converter does to Llama q/k rows (interleaved rope pairs)."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(folder, out_path, *, quantize_o=False):
    cfg = testing.tiny_hf_config("llama")
    tensors = load_file(folder / "model.safetensors")
    writer = gguf.GGUFWriter(out_path, "llama")
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, w in tensors.items():
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers.") :].split(".", 1)
            target = f"blk.{layer}.{TO_GGUF[rest]}"
        else:
            target = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        if "q_proj" in name:
            w = llama_cpp_permute(w, cfg["num_attention_heads"])
        elif "k_proj" in name:
            w = llama_cpp_permute(w, cfg["num_key_value_heads"])
        if quantize_o and "o_proj" in name:  # [D, N*H]: rows of 64, Q8_0 blocks of 32
            q8 = gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(
                target, q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
            )
        else:
            writer.add_tensor(target, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


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
