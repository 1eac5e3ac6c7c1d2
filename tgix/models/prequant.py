"""Pre-quantized checkpoints, detected from config.json's `quantization_config` (as TGI does):
AWQ (GEMM packing), GPTQ (v1 and v2 zeros, act-order `g_idx`; TGI's `marlin` names the same
checkpoints), compressed-tensors (`pack-quantized` int4/int8, `float-quantized` fp8) and
ExLlamaV2's exl2 (variable bits per group: tgix/models/exl2.py).

Each quantized layer's tensors (`qweight`/`qzeros`/`scales`/`g_idx`, or `weight_packed`/
`weight_scale`/`weight_zero_point`/`weight_g_idx`/`weight_shape`) are unpacked into one
quant_group.GroupedWeight [N, K] and shown to the weight loader as the layer's `weight`: the
GroupedWeight itself for the kept form, its float dequantization otherwise. The unpackers
follow each format's reference packer (AutoAWQ `gemm`, AutoGPTQ `pack`, compressed-tensors
`pack_to_int32`); tgix/testing_quant.py writes checkpoints the same way for the tests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_dtypes
import numpy as np

from tgix.models.checkpoint import CheckpointError, TensorSource
from tgix.models.exl2 import exl2_layout, looks_like_exl2, read_exl2
from tgix.models.quant_group import GroupedWeight, GroupLayout, unpack_words

PREQUANTIZED = ("awq", "gptq", "marlin", "compressed-tensors", "exl2")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]


class QuantizeError(ValueError):
    """A checkpoint or `--quantize` combination tgix refuses; the message names both values."""


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """A checkpoint's quantization_config, as far as the unpackers need it."""

    method: str  # awq | gptq | compressed-tensors | exl2
    bits: int  # exl2: 8, the codes' storage (each group has its own width)
    group: int  # inputs per group; -1: one group of all inputs
    sym: bool = True
    zeros_v2: bool = False  # GPTQ checkpoint_format gptq_v2: the stored zeros are the zeros
    fp8: bool = False  # compressed-tensors float-quantized: fp8 weights, per-channel scales


def read_spec(hf_config: dict, folder: Path | None = None, names=()) -> QuantSpec | None:
    """The checkpoint's QuantSpec (None: a float checkpoint). GPTQ's `quantize_config.json`
    counts when config.json has none, and so do exl2 tensors among `names` (ExLlamaV2 before
    v0.0.16 wrote no quantization_config). Raises QuantizeError for what tgix cannot read."""
    qc = hf_config.get("quantization_config")
    if qc is None and looks_like_exl2(names):
        qc = {"quant_method": "exl2"}
    if qc is None and folder is not None and (Path(folder) / "quantize_config.json").exists():
        qc = {
            "quant_method": "gptq",
            **json.loads((Path(folder) / "quantize_config.json").read_text()),
        }
    if qc is None:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or qc.get("bits", 4) != 4:
            raise QuantizeError(
                f"AWQ checkpoint with version {version!r} and {qc.get('bits')} bits: tgix reads "
                "AWQ's 4-bit `gemm` packing only"
            )
        return QuantSpec("awq", 4, int(qc.get("group_size", 128)))
    if method == "gptq":
        bits = int(qc.get("bits", 4))
        if bits not in (2, 4, 8):
            raise QuantizeError(f"GPTQ checkpoint with {bits} bits: tgix reads 2, 4 and 8 bits")
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise QuantizeError(f"GPTQ checkpoint_format {fmt!r}: tgix reads gptq and gptq_v2")
        return QuantSpec(
            "gptq", bits, int(qc.get("group_size", 128)), sym=bool(qc.get("sym", True)),
            zeros_v2=fmt == "gptq_v2",
        )  # fmt: skip
    if method == "compressed-tensors":
        return _compressed_tensors_spec(qc)
    if method == "exl2":
        return QuantSpec("exl2", 8, -1)
    raise QuantizeError(
        f"quantization_config quant_method {method!r} is not supported; tgix reads "
        "awq, gptq, compressed-tensors and exl2 checkpoints"
    )


def _compressed_tensors_spec(qc: dict) -> QuantSpec:
    groups = list((qc.get("config_groups") or {}).values())
    weights = [g.get("weights") for g in groups if g.get("weights")]
    if not weights or any(w != weights[0] for w in weights):
        raise QuantizeError(
            "compressed-tensors checkpoint: tgix reads one weight scheme for every layer"
        )
    w = weights[0]
    fmt = groups[0].get("format") or qc.get("format")
    kind, bits, strategy = w.get("type", "int"), int(w.get("num_bits", 8)), w.get("strategy")
    fp8 = kind == "float" and bits == 8 and strategy in ("channel", "tensor")
    if fmt == "float-quantized" and fp8:
        return QuantSpec("compressed-tensors", 8, -1, fp8=True)
    if (
        fmt == "pack-quantized"
        and kind == "int"
        and bits in (4, 8)
        and strategy in ("group", "channel")
    ):
        group = int(w.get("group_size") or -1) if strategy == "group" else -1
        return QuantSpec("compressed-tensors", bits, group, sym=bool(w.get("symmetric", True)))
    raise QuantizeError(
        f"compressed-tensors format {fmt!r} with {kind} {bits}-bit {strategy} weights is not "
        "supported; tgix reads pack-quantized int4/int8 (group or channel) and "
        "float-quantized fp8 (channel or tensor)"
    )


def check_flag(spec: QuantSpec | None, flag: str | None) -> str | None:
    """The effective method of a checkpoint loaded with `--quantize flag`; raises QuantizeError
    when the two contradict (a pre-quantized flag on a float checkpoint, or another method)."""
    if spec is None:
        if flag in PREQUANTIZED:
            raise QuantizeError(
                f"`--quantize {flag}` reads a pre-quantized checkpoint, but this model's "
                "config.json has no quantization_config (a float model quantizes at load with "
                "`--quantize eetq`, `bitsandbytes` or `fp8`)"
            )
        return flag
    allowed = {spec.method} | ({"marlin"} if spec.method in ("awq", "gptq") else set())
    if spec.fp8:
        allowed.add("fp8")
    if flag is not None and flag not in allowed:
        raise QuantizeError(
            f"`--quantize {flag}` contradicts the checkpoint, which is quantized with "
            f"`{spec.method}` (config.json quantization_config): pass `--quantize "
            f"{spec.method}` or leave the flag out"
        )
    return spec.method


def _act_order(codes: np.ndarray, g_idx: np.ndarray | None, group: int):
    """(codes [N, K] with columns permuted so groups are contiguous, perm or None). A g_idx
    other than arange(K) // G is GPTQ's act-order; each of its groups must hold G inputs."""
    k = codes.shape[1]
    natural = np.arange(k) // group
    if g_idx is None or np.array_equal(g_idx, natural):
        return codes, None
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    if not np.array_equal(np.asarray(g_idx)[perm], natural):
        raise CheckpointError(f"g_idx does not split the {k} inputs into groups of {group}")
    return codes[:, perm], perm


def _is_head(prefix: str) -> bool:
    """The LM head (`language_model.lm_head` inside a vision-language checkpoint)."""
    return prefix == "lm_head" or prefix.endswith(".lm_head")


class PrequantizedSource:
    """A TensorSource over a pre-quantized checkpoint: each quantized layer's tensors appear
    as one `<layer>.weight`, read as a GroupedWeight (`kept`) or as its float dequantization.
    A quantized LM head (exl2 quantizes it) is always read as float, as the load-time
    methods leave it."""

    _PARTS = {
        "awq": ("qweight", "qzeros", "scales"),
        "gptq": ("qweight", "qzeros", "scales", "g_idx"),
        "compressed-tensors": (
            "weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx",
            "weight_shape", "input_scale",
        ),
        "exl2": ("q_weight", "q_groups", "q_scale", "q_scale_max", "q_invperm", "q_perm"),
    }  # fmt: skip

    def __init__(
        self, inner: TensorSource, spec: QuantSpec, *, kept: bool, vocab_size: int | None = None
    ):
        self.inner, self.spec, self.kept = inner, spec, kept
        self.vocab_size = vocab_size  # an exl2 LM head's padded columns are cut to it
        names = self._inner_names = set(inner.names())
        marker = {"compressed-tensors": "weight_scale", "exl2": "q_weight"}.get(
            spec.method, "qweight"
        )
        self.layers = sorted(n[: -len(marker) - 1] for n in names if n.endswith("." + marker))
        self._layer_set = frozenset(self.layers)
        parts = {f"{p}.{s}" for p in self.layers for s in self._PARTS[spec.method]}
        self._names = [n for n in inner.names() if n not in parts]
        replaced = {f"{p}.weight" for p in self.layers}  # fp8: the codes' own name
        self._names = [n for n in self._names if n not in replaced]
        self._names += [f"{p}.weight" for p in self.layers]
        if not self.layers:
            raise CheckpointError(f"a {spec.method} config but no quantized layer tensors")

    def names(self) -> list[str]:
        return self._names

    def read(self, name: str):
        prefix = name[: -len(".weight")]
        if not name.endswith(".weight") or prefix not in self._layer_set:
            return self.inner.read(name)
        weight = self.read_grouped(prefix)
        return weight if self.kept and not _is_head(prefix) else weight.dequantize()

    def layout(self, name: str) -> GroupLayout | None:
        """The kept form's layout of tensor `name` (None: a float tensor), from shapes and
        g_idx alone (the codes are not unpacked twice)."""
        prefix = name[: -len(".weight")]
        if not self.kept or prefix not in self._layer_set or _is_head(prefix):
            return None
        get = lambda part: self.inner.read(f"{prefix}.{part}")
        g_idx = None
        if self.spec.method == "exl2":
            perms = {p: get(p) for p in ("q_invperm", "q_perm") if self._has(prefix, p)}
            return exl2_layout(get("q_weight").shape[0], get("q_groups"), **perms)
        if self.spec.fp8:  # one group per row: the channel (or tensor) scale
            k = get("weight").shape[1]
            return GroupLayout(8, k, zero=False, offset=False, perm=False, codebook="fp8_e4m3fn")
        if self.spec.method == "awq":
            k, groups = get("qweight").shape[0], get("scales").shape[0]
        elif self.spec.method == "gptq":
            k, groups = get("qweight").shape[0] * 32 // self.spec.bits, get("scales").shape[0]
            g_idx = get("g_idx") if self._has(prefix, "g_idx") else None
        else:
            n, k = (int(v) for v in get("weight_shape"))
            groups = get("weight_scale").reshape(n, -1).shape[1]
            g_idx = get("weight_g_idx") if self._has(prefix, "weight_g_idx") else None
        natural = g_idx is None or np.array_equal(g_idx, np.arange(k) // (k // groups))
        return GroupLayout(self.spec.bits, k // groups, zero=True, offset=False, perm=not natural)

    def _has(self, prefix: str, part: str) -> bool:
        return f"{prefix}.{part}" in self._inner_names

    def read_grouped(self, prefix: str) -> GroupedWeight:
        """Layer `prefix`'s weight [N, K] (fp8: its bytes as codes of the fp8 codebook, one
        group per row)."""
        get = lambda part: np.asarray(self.inner.read(f"{prefix}.{part}"))
        has = lambda part: self._has(prefix, part)
        spec = self.spec
        try:
            if spec.method == "awq":
                return self._awq(get("qweight"), get("qzeros"), get("scales"))
            if spec.method == "gptq":
                g_idx = get("g_idx") if has("g_idx") else None
                return self._gptq(get("qweight"), get("qzeros"), get("scales"), g_idx)
            if spec.method == "exl2":
                perms = {p: get(p) for p in ("q_invperm", "q_perm") if has(p)}
                parts = (get(p) for p in ("q_weight", "q_groups", "q_scale", "q_scale_max"))
                n = self.vocab_size if _is_head(prefix) else None
                return read_exl2(*parts, **perms, out_features=n)
            if spec.fp8:
                if get("weight").dtype != np.dtype(ml_dtypes.float8_e4m3fn):
                    raise CheckpointError(f"{prefix}.weight is {get('weight').dtype}, not F8_E4M3")
                codes = np.ascontiguousarray(get("weight")).view(np.uint8)
                scale = get("weight_scale").astype(np.float32).reshape(-1, 1)
                scale = np.broadcast_to(scale, (codes.shape[0], 1)).copy()  # a tensor scale
                return GroupedWeight(codes, scale, 8, codebook="fp8_e4m3fn")
            zp = get("weight_zero_point") if has("weight_zero_point") else None
            g_idx = get("weight_g_idx") if has("weight_g_idx") else None
            shape = tuple(int(v) for v in get("weight_shape"))
            return self._packed(get("weight_packed"), get("weight_scale"), zp, g_idx, shape)
        except (ValueError, IndexError, KeyError) as e:
            raise CheckpointError(f"{prefix}: {spec.method} tensors do not fit ({e})") from e

    def _awq(self, qweight, qzeros, scales) -> GroupedWeight:
        """qweight [K, N/8], qzeros [K/G, N/8] packed along N in AWQ_ORDER; scales [K/G, N]."""

        def columns(words):
            nibbles = unpack_words(words, 4, 1).reshape(words.shape[0], -1, 8)
            out = np.empty_like(nibbles)
            out[:, :, list(AWQ_ORDER)] = nibbles
            return out.reshape(words.shape[0], -1)

        q, z = columns(qweight).T, columns(qzeros).T  # [N, K], [N, K/G]
        return GroupedWeight(
            np.ascontiguousarray(q), scales.astype(np.float32).T.copy(), 4,
            zero=z.astype(np.float32),
        )  # fmt: skip

    def _gptq(self, qweight, qzeros, scales, g_idx) -> GroupedWeight:
        """qweight [K*b/32, N] packed along K; qzeros [K/G, N*b/32] along N; scales [K/G, N];
        v1 stores zero - 1, v2 the zero (sym v2 zeros read as "gptq" are recognised by value,
        2^(b-1) everywhere, as vLLM does)."""
        b = self.spec.bits
        q = unpack_words(qweight, b, 0).T  # [N, K]
        z = unpack_words(qzeros, b, 1).astype(np.float32)  # [K/G, N]
        v2 = self.spec.zeros_v2 or (self.spec.sym and np.all(z == 2 ** (b - 1)))
        zero = (z if v2 else z + 1).T.copy()
        group = q.shape[1] // scales.shape[0]
        q, perm = _act_order(q, g_idx, group)
        return GroupedWeight(
            np.ascontiguousarray(q), scales.astype(np.float32).T.copy(), b, zero=zero, perm=perm
        )

    def _packed(self, packed, scale, zp, g_idx, shape) -> GroupedWeight:
        """compressed-tensors pack-quantized: weight_packed [N, K*b/32] along K, stored
        unsigned (+2^(b-1)); zero points [N*b/32, K/G] along N, also unsigned; scale [N, K/G]."""
        b = self.spec.bits
        n, k = shape
        q = unpack_words(packed, b, 1)[:, :k]
        scale = scale.astype(np.float32).reshape(n, -1)
        zero = (
            np.full(scale.shape, 2.0 ** (b - 1), np.float32)
            if zp is None
            else unpack_words(zp, b, 0)[:n].astype(np.float32).reshape(scale.shape)
        )
        q, perm = _act_order(q, g_idx, k // scale.shape[1])
        return GroupedWeight(np.ascontiguousarray(q), scale, b, zero=zero, perm=perm)
