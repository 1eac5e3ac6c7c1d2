"""Model registry and loading: resolve files, read the config, build the decoder, place weights."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from tgix.attention.contract import LayerKV
from tgix.models.checkpoint import CheckpointError, SafetensorsSource
from tgix.models.config import ModelConfig, UnsupportedModelError
from tgix.models.decoder import CausalLM
from tgix.models.gguf import GGUFSource
from tgix.models.hub import ModelFiles, resolve_model
from tgix.models.kv_scales import WithoutKVScales, apply_kv_scales
from tgix.models.medusa import MedusaConfig, load_medusa
from tgix.models.moe import set_moe_impl
from tgix.models.out_major import default_out_major, out_major_abstract
from tgix.models.prequant import (
    PREQUANTIZED,
    PrequantizedSource,
    QuantizeError,
    check_flag,
    read_spec,
)
from tgix.models.quant import CODES_DTYPE, default_native, quantize_abstract
from tgix.models.quant_group import (
    CODEBOOK_METHODS,
    GROUPED_FORMS,
    codebook_abstract,
    default_form,
    group_abstract,
)
from tgix.models.vlm import TextModelSource, load_vision, vision_checkpoint
from tgix.models.weights import grouped_layouts, load_weights
from tgix.sharding import check_fits, kv_repeats, mesh_for_model
from tgix.sharding.rules import expert_axis

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "LayerKV",
    "LoadedModel",
    "ModelConfig",
    "QuantizeError",
    "UnsupportedModelError",
    "build_model",
    "default_dtype",
    "load_model",
    "place",
]


def default_dtype():
    """float32 on CPU (XLA:CPU bf16 matmuls are ~30x slower), bfloat16 on GPU/TPU."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def build_model(
    cfg: ModelConfig, *, dtype=None, seed: int = 0, abstract: bool = False, attention="paged"
):
    """A decoder with random weights, or (abstract=True) its shapes only, allocating nothing."""
    dtype = dtype or default_dtype()  # every family is the shared decoder with its switches
    make = lambda: CausalLM(cfg, rngs=nnx.Rngs(seed), dtype=dtype, attention=attention)
    return nnx.eval_shape(make) if abstract else make()


@dataclasses.dataclass
class LoadedModel:
    model: CausalLM
    config: ModelConfig
    files: ModelFiles
    mesh: Mesh
    checkpoint_kv_heads: int | None = None  # K before repetition for the mesh
    medusa: MedusaConfig | None = None  # the Medusa folder whose heads the model carries
    quantize: str | None = None  # its linear layers' quantization (load-time or checkpoint's)
    quantize_form: str | None = None  # a pre-quantized checkpoint's: quant_group.GROUPED_FORMS
    vision: object | None = None  # a VLM's image encoder (tgix/models/vision/), else None
    vision_model_type: str | None = None  # its checkpoint's model_type (idefics3, smolvlm)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every parameter on the devices (codes and scales when quantized)."""
        return sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(self.model, nnx.Param)))

    @property
    def draft_heads(self) -> int:
        """Medusa heads the model carries (0: none; --speculate then uses n-gram lookup)."""
        return 0 if self.medusa is None else self.medusa.num_heads


def load_model(
    model_id: str | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    dtype=None,
    mesh: Mesh | None = None,
    num_shard: int | None = 1,
    data: int = 1,
    attention: str = "paged",
    quantize: str | None = None,
    int8_activations: bool | None = None,
    native_int8: bool | None = None,
    quantize_form: str | None = None,
) -> LoadedModel:
    """Load a checkpoint (folder, .gguf, Hub id; None = the embedded SmolLM2) onto `mesh`.
    A Medusa folder (config.json with `medusa_num_heads`, tgix/models/medusa.py) loads its
    `base_model_name_or_path` and carries the heads on `model.medusa`.

    On a model axis wider than the KV heads, each KV head is repeated at load time
    (`LoadedModel.config.num_kv_heads` is then the repeated count; the checkpoint's is kept
    in `checkpoint_kv_heads`). Without `mesh`, one over `num_shard` devices (None: the
    widest layout the heads allow on every visible device, or on 1/`data` of them when
    `data` replicas will share them); a count the heads refuse raises ShardingError naming
    the valid ones. The model goes to the first replica's devices (`place` copies it).
    `quantize` (eetq, bitsandbytes, fp8: tgix/models/quant.py; bitsandbytes-nf4/-fp4:
    4-bit codebooks, quant_group.py, always kept) quantizes every linear layer as it loads
    (embeddings, norms, the LM head and Medusa heads stay in `dtype`); `int8_activations`
    picks the int8 matmul form (None: quant.default_int8_activations), and `native_int8`
    whether tgix's int8 CPU kernel runs it (None: quant.default_native; never on a mesh of
    several devices).

    A pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors, exl2: models/prequant.py) is
    detected from its quantization_config; `quantize` may name its method (or TGI's alias
    `marlin`), and anything else raises QuantizeError naming both. `quantize_form` (None:
    env TGIX_QUANT_FORM, else quant_group.default_form()) is how its layers run, and those
    of a GGUF file's Q8_0/Q4_0/Q4_1/Q4_K linear weights (gguf_blocks.py): float, kept or
    int8 (tgix/models/quant_group.py)."""
    known = (*CODES_DTYPE, *CODEBOOK_METHODS, *PREQUANTIZED)
    if quantize is not None and quantize not in known:
        raise QuantizeError(f"`--quantize {quantize}` is not implemented in tgix")
    files = resolve_model(model_id, revision=revision, token=token, cache_dir=cache_dir)
    medusa = MedusaConfig.read(files.path) if files.kind == "safetensors" else None
    if medusa is not None:  # heads only: the base model they were trained on is elsewhere
        files = resolve_model(medusa.base_model, token=token, cache_dir=cache_dir)
    if files.kind == "gguf":
        source = GGUFSource(files.path)
        hf_config = source.hf_config()
    else:
        config_file = files.path / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{files.path} has no config.json")
        hf_config = json.loads(config_file.read_text())
        source = SafetensorsSource(files.path)
    vlm = vision_checkpoint(hf_config)
    if vlm is not None:  # the decoder inside a vision-language checkpoint
        hf_config, source = vlm.text_config, TextModelSource(source, vlm.text_prefixes)
    spec = None
    if files.kind == "safetensors":
        spec = read_spec(hf_config, files.path, source.names())
    quantize = check_flag(spec, quantize)
    form = None  # how pre-quantized layers run (quant_group.GROUPED_FORMS)
    blocks = files.kind == "gguf" and quantize is None and source.quantized_linear
    if spec is not None or blocks:
        form = quantize_form or os.environ.get("TGIX_QUANT_FORM") or default_form()
        if form not in GROUPED_FORMS:
            raise QuantizeError(f"quantize form {form!r}: one of {', '.join(GROUPED_FORMS)}")
        if spec is not None:
            vocab = hf_config.get("vocab_size")
            source = PrequantizedSource(source, spec, kept=form == "kept", vocab_size=vocab)
        else:
            source.keep_blocks = form == "kept"
    source = WithoutKVScales(source)
    checkpoint_cfg = ModelConfig.from_hf(hf_config)
    if checkpoint_cfg.is_moe and (spec is not None or blocks):
        raise QuantizeError(
            f"{checkpoint_cfg.model_type}: quantized experts are not supported yet "
            "(a float checkpoint loads; --quantize leaves its experts in float)"
        )
    if mesh is None:
        mesh = mesh_for_model(checkpoint_cfg, num_shard, data=data)
        mesh = Mesh(mesh.devices[:1], mesh.axis_names)  # replica 0
    if spec is not None and spec.method == "exl2" and mesh.shape["model"] > 1:
        raise QuantizeError("Sharding is currently not supported with `exl2` quantization")
    check_fits(checkpoint_cfg, mesh)
    repeats = kv_repeats(checkpoint_cfg.num_kv_heads, mesh.shape["model"])
    cfg = dataclasses.replace(checkpoint_cfg, num_kv_heads=checkpoint_cfg.num_kv_heads * repeats)
    dtype = jnp.dtype(dtype or default_dtype())  # accepts "bfloat16" etc.
    abstract = build_model(cfg, dtype=dtype, abstract=True, attention=attention)
    load_time = "eetq" if form == "int8" else quantize if spec is None else None
    native = False  # linear layers on tgix's int8 CPU kernel (quant.qmatmul)
    if load_time in CODEBOOK_METHODS:
        abstract = codebook_abstract(abstract, load_time)
    elif load_time is not None:
        native = default_native(load_time) if native_int8 is None else native_int8
        native = native and mesh.devices.size == 1  # GSPMD cannot split an FFI call
        abstract = quantize_abstract(
            abstract, load_time, int8_activations=int8_activations, native=native
        )
    if form == "kept":
        abstract = group_abstract(abstract, grouped_layouts(checkpoint_cfg, source))
    if default_out_major():  # the float layers that are left: [out, in] on CPU
        abstract = out_major_abstract(abstract)
    if expert_axis(cfg, mesh.shape["model"]):  # each device computes its own experts
        logger.info("experts split over %d devices: dense expert path", mesh.shape["model"])
        set_moe_impl(abstract, "dense")
    model = load_weights(
        abstract, checkpoint_cfg, source, mesh, dtype, kv_repeats=repeats, quantize=load_time
    )
    apply_kv_scales(model, source.scales)
    if native:  # the head's bfloat16 copy, read by the same kernels (decoder.logits)
        head = model.head_weight().astype(jnp.bfloat16)
        model.head_bf16 = nnx.data(nnx.Param(head, axes=("vocab", "embed")))
    if medusa is not None:
        heads = load_medusa(
            medusa, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, mesh=mesh, dtype=dtype
        )
        model.medusa = nnx.data(heads)  # a submodule: its parameters join the model's state
    vision = None
    if vlm is not None:
        vision = load_vision(vlm.model_type, files.path, dtype=dtype)
    return LoadedModel(
        model=model,
        config=cfg,
        files=files,
        mesh=mesh,
        checkpoint_kv_heads=checkpoint_cfg.num_kv_heads,
        medusa=medusa,
        quantize=quantize,
        quantize_form=form,
        vision=vision,
        vision_model_type=None if vlm is None else vlm.model_type,
    )


def place(loaded: LoadedModel, mesh: Mesh) -> LoadedModel:
    """A copy of `loaded`'s parameters on another mesh of the same shape (a data-parallel
    replica): each parameter keeps its logical layout, device_put device to device."""
    from tgix.sharding import sharding_for

    if dict(mesh.shape) != dict(loaded.mesh.shape):
        raise ValueError(f"mesh {dict(mesh.shape)} differs from {dict(loaded.mesh.shape)}")
    graphdef, state = nnx.split(loaded.model)

    def copy(var: nnx.Variable) -> nnx.Variable:
        value = var[...]
        return var.replace(jax.device_put(value, sharding_for(mesh, var.axes, value.shape)))

    state = jax.tree.map(copy, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return dataclasses.replace(loaded, model=nnx.merge(graphdef, state), mesh=mesh)
