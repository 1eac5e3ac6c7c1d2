"""Test support: tiny pre-quantized checkpoints (AWQ, GPTQ v1/v2/act-order, compressed-tensors)
written from a float one (tgix.testing.write_tiny_checkpoint), each with a float twin.

Every writer quantizes the float model's linear layers per group of inputs, packs the codes the
way the format's reference packer does (AutoAWQ's `gemm` order, AutoGPTQ's `pack` with its
`zeros - 1`, compressed-tensors' `pack_to_int32`), and also writes `reference`, a float
checkpoint holding exactly what the format's definition dequantizes to, computed from the codes
before packing: tests compare tgix's unpacked weights with it bit for bit and run transformers
on it for logits.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np

LINEAR = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "qkv_proj", "gate_up_proj",  # Phi-3 fused
)  # fmt: skip
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _pack(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned codes -> int32 words, 32 / bits per word along `axis`, low bits first."""
    per = 32 // bits
    codes = np.moveaxis(codes.astype(np.uint32), axis, -1)
    words = codes.reshape(*codes.shape[:-1], -1, per) << (np.arange(per, dtype=np.uint32) * bits)
    return np.moveaxis(np.bitwise_or.reduce(words, axis=-1), -1, axis).view(np.int32)


def _quantize_groups(w: np.ndarray, bits: int, group: int, sym: bool, low: int = 0):
    """w [N, K] -> (q [N, K] unsigned, scale [N, K/G] (float16-exact float32), zero [N, K/G]).
    Asymmetric: the group's range over 2^b - 1 steps, zeros from `low` up; symmetric: zero
    2^(b-1)."""
    n, k = w.shape
    top = 2**bits - 1
    g = w.reshape(n, k // group, group)
    if sym:
        scale = np.abs(g).max(-1) / (2 ** (bits - 1) - 1)
        zero = np.full(scale.shape, 2 ** (bits - 1))
    else:
        lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
        scale = (hi - lo) / top
        zero = np.clip(np.rint(-lo / np.where(scale > 0, scale, 1)), low, top)
    scale = np.where(scale > 0, scale, 1).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(g / scale[..., None]) + zero[..., None], 0, top).reshape(n, k)
    return q.astype(np.uint8), scale, zero.astype(np.int64)


def _dequantized(q, scale, zero, group):
    n, k = q.shape
    w = (q.astype(np.float32).reshape(n, k // group, group) - zero[..., None]) * scale[..., None]
    return w.reshape(n, k).astype(np.float32)


def write_checkpoint(
    base, path, reference, tensors, ref_tensors, quantization_config, extra_files=None
):
    """`path`: base's tokenizer and config files beside `tensors` (the packed weights), with
    `quantization_config` in config.json; `reference` (None: not written): the same beside
    `ref_tensors` (the dequantized floats) and no quantization_config. Returns path."""
    from safetensors.numpy import save_file

    base, path = pathlib.Path(base), pathlib.Path(path)
    for folder, weights, qc in (
        (path, tensors, quantization_config),
        (reference, ref_tensors, None),
    ):
        if folder is None:
            continue
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for f in base.iterdir():
            if (
                f.is_file()
                and f.suffix != ".safetensors"
                and f.name != "model.safetensors.index.json"
            ):
                shutil.copy(f, folder / f.name)
        config = json.loads((base / "config.json").read_text())
        if qc is not None:
            config["quantization_config"] = qc
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        # safetensors' numpy writer stores a non-contiguous array's buffer as is (a transpose
        # would be saved untransposed): hand it C-ordered copies
        weights = {name: np.ascontiguousarray(value) for name, value in weights.items()}
        save_file(weights, str(folder / "model.safetensors"))
    for name, text in (extra_files or {}).items():
        (path / name).write_text(text)
    return path


def float_tensors(base) -> dict[str, np.ndarray]:
    """name -> array of every tensor in base's safetensors files."""
    from safetensors.numpy import load_file

    tensors = {}
    for f in sorted(pathlib.Path(base).glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


def linear_layers(tensors, skip) -> list[str]:
    """Names (without ".weight") of the decoder's linear layers in tensors, minus `skip`."""
    return [
        name[: -len(".weight")]
        for name in tensors
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR
        and name[: -len(".weight")] not in skip
    ]  # fmt: skip


def write_roundtrip_twin(src, dst, roundtrip, head=None) -> pathlib.Path:
    """A float copy of checkpoint `src` whose linear weights [N, K] are `roundtrip(w)`
    (quantize then dequantize with a load-time method: the weights that method serves), and
    an untied `lm_head.weight` `head(w)` when given (the bfloat16 head of tgix's int8 CPU
    kernel, for one)."""
    from safetensors.numpy import load_file, save_file

    dst = pathlib.Path(shutil.copytree(src, dst))
    for file in dst.glob("*.safetensors"):
        tensors = load_file(file)
        for name, value in tensors.items():
            if name.split(".")[-2] in LINEAR and name.endswith(".weight"):
                tensors[name] = roundtrip(value)
            elif name == "lm_head.weight" and head is not None:
                tensors[name] = head(value)
        save_file(tensors, file, metadata={"format": "pt"})
    return dst


def write_awq_checkpoint(base, path, *, reference=None, group: int = 8, skip=()) -> pathlib.Path:
    """AutoAWQ `gemm` checkpoint (4-bit, asymmetric): qweight [K, N/8] and qzeros [K/G, N/8]
    packed along N in AWQ's order, scales [K/G, N] float16; `skip` layers stay float (listed
    in modules_to_not_convert)."""
    tensors = float_tensors(base)
    out, ref = dict(tensors), dict(tensors)
    for layer in linear_layers(tensors, skip):
        w = out.pop(f"{layer}.weight")
        q, scale, zero = _quantize_groups(w, 4, group, sym=False)
        ref[f"{layer}.weight"] = _dequantized(q, scale, zero, group)

        def awq_pack(cols):  # [rows, N] -> [rows, N/8]: nibble i holds column 8c + order[i]
            return _pack(
                cols.reshape(cols.shape[0], -1, 8)[:, :, list(_AWQ_ORDER)].reshape(cols.shape), 4, 1
            )

        out[f"{layer}.qweight"] = awq_pack(q.T)
        out[f"{layer}.qzeros"] = awq_pack(zero.T)
        out[f"{layer}.scales"] = scale.T.astype(np.float16)
    qc = {
        "quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
        "version": "gemm", "modules_to_not_convert": list(skip) or None,
    }  # fmt: skip
    return write_checkpoint(base, path, reference, out, ref, qc)


def write_gptq_checkpoint(
    base, path, *, reference=None, group: int = 8, bits: int = 4, version: str = "v1",
    act_order: bool = False, sym: bool = True, seed: int = 0,
) -> pathlib.Path:  # fmt: skip
    """AutoGPTQ checkpoint: qweight [K*b/32, N] packed along K, qzeros [K/G, N*b/32] along N
    (v1 stores zero - 1, `version="v2"` the zero), scales [K/G, N] float16, g_idx [K]
    (`act_order`: a random order of the inputs decides their groups, as desc_act does)."""
    tensors = float_tensors(base)
    out, ref = dict(tensors), dict(tensors)
    rng = np.random.default_rng(seed)
    for layer in linear_layers(tensors, ()):
        w = out.pop(f"{layer}.weight")
        k = w.shape[1]
        order = rng.permutation(k) if act_order else np.arange(k)
        g_idx = np.empty(k, np.int32)
        g_idx[order] = np.arange(k) // group  # input order[j] is the j-th in act order
        # v1 stores zero - 1, so a zero of 0 cannot be written (AutoGPTQ's overflow, the reason
        # v2 exists): v1 groups get zeros of at least 1, as an all-positive group needs
        q_sorted, scale, zero = _quantize_groups(w[:, order], bits, group, sym, low=version == "v1")
        q = np.empty_like(q_sorted)
        q[:, order] = q_sorted
        deq = (q.astype(np.float32) - zero[:, g_idx]) * scale[:, g_idx]
        ref[f"{layer}.weight"] = deq.astype(np.float32)
        stored = zero - 1 if version == "v1" else zero
        out[f"{layer}.qweight"] = _pack(q.T, bits, 0)
        out[f"{layer}.qzeros"] = _pack((stored.T & (2**bits - 1)), bits, 1)
        out[f"{layer}.scales"] = scale.T.astype(np.float16)
        out[f"{layer}.g_idx"] = g_idx
    qc = {
        "quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
        "sym": sym, "checkpoint_format": "gptq" if version == "v1" else "gptq_v2",
    }  # fmt: skip
    return write_checkpoint(base, path, reference, out, ref, qc)


def write_compressed_tensors_checkpoint(
    base, path, *, reference=None, bits: int = 4, group: int | None = 8, sym: bool = True,
    fp8: bool = False,
) -> pathlib.Path:  # fmt: skip
    """compressed-tensors checkpoint: `pack-quantized` int weights (weight_packed [N, K*b/32]
    stored unsigned, weight_scale [N, K/G], weight_zero_point packed along N when asymmetric,
    weight_shape; `group=None`: per channel) or `fp8` `float-quantized` (weight float8_e4m3fn
    [N, K], weight_scale [N, 1])."""
    import ml_dtypes

    tensors = float_tensors(base)
    out, ref = dict(tensors), dict(tensors)
    for layer in linear_layers(tensors, ()):
        w = out.pop(f"{layer}.weight")
        n, k = w.shape
        if fp8:
            scale = (np.abs(w).max(1, keepdims=True) / 448.0).astype(np.float32)
            codes = np.clip(w / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
            ref[f"{layer}.weight"] = codes.astype(np.float32) * scale
            out[f"{layer}.weight"], out[f"{layer}.weight_scale"] = codes, scale
            continue
        g = group or k
        q, scale, zero = _quantize_groups(w, bits, g, sym)
        ref[f"{layer}.weight"] = _dequantized(q, scale, zero, g)
        out[f"{layer}.weight_packed"] = _pack(q, bits, 1)
        out[f"{layer}.weight_scale"] = scale.astype(np.float16)
        out[f"{layer}.weight_shape"] = np.array([n, k], np.int64)
        if not sym:
            out[f"{layer}.weight_zero_point"] = _pack(zero.astype(np.uint8), bits, 0)
    weights = (
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
        if fp8
        else {
            "num_bits": bits, "type": "int", "symmetric": sym,
            "strategy": "group" if group else "channel", "group_size": group,
        }
    )  # fmt: skip
    qc = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized" if fp8 else "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }
    return write_checkpoint(base, path, reference, out, ref, qc)


_TO_GGUF = {
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
_GLOBAL_TO_GGUF = {
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


def write_gguf(base, out_path, *, types: dict[str, str] | None = None) -> pathlib.Path:
    """The Llama checkpoint at `base` as llama.cpp's converter writes it (q/k rows permuted),
    float32 except the linear weights `types` names: projection (e.g. "o_proj") -> GGML type
    that `gguf.quants.quantize` writes ("Q8_0", "Q4_0", "Q4_1"); "*" for every projection."""
    import gguf

    cfg = json.loads((pathlib.Path(base) / "config.json").read_text())
    tensors = float_tensors(base)
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
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    for name, w in tensors.items():
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers.") :].split(".", 1)
            target = f"blk.{layer}.{_TO_GGUF[rest]}"
        else:
            target = _GLOBAL_TO_GGUF[name]
        if "q_proj" in name:
            w = llama_cpp_permute(w, cfg["num_attention_heads"])
        elif "k_proj" in name:
            w = llama_cpp_permute(w, cfg["num_key_value_heads"])
        proj = name.split(".")[-2]
        qtype = (types or {}).get(proj, (types or {}).get("*")) if proj in LINEAR else None
        if qtype is not None:
            kind = gguf.GGMLQuantizationType[qtype]
            blocks = gguf.quants.quantize(np.ascontiguousarray(w, np.float32), kind)
            writer.add_tensor(target, blocks, raw_shape=blocks.shape, raw_dtype=kind)
        else:
            writer.add_tensor(target, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pathlib.Path(out_path)
