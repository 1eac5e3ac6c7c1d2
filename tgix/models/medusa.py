"""Medusa heads: extra output heads that each guess one more token ahead, for --speculate.

A Medusa checkpoint (FasterDecoding/Medusa, TGI's `--speculate` with heads) is a folder whose
`config.json` has `medusa_num_heads`, `medusa_num_layers` and `base_model_name_or_path` (the
model the heads were trained on), and whose `medusa_lm_head.safetensors` holds, for head m
and block b: `{m}.{b}.linear.weight [D, D]`, `{m}.{b}.linear.bias [D]` (a residual block
x + silu(W x + b)) and `{m}.{B}.weight [V, D]`, the head's own output projection ("V1"). A
"V2" file has the blocks only: every head then reads the base model's LM head.

Head m, applied to the final (normed) hidden state at the position that samples token t+1,
guesses token t+2+m; the drafts of a row are the heads' argmaxes (TGI's linear, not tree,
verification: the engine checks them like any other draft, so a wrong head costs speed only).

Shape letters (besides tgix/models/layers.py's): M draft heads, B residual blocks per head,
S sampled positions of a step.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tgix.models.checkpoint import CheckpointError, SafetensorsFile
from tgix.sharding import sharding_for

HEADS_FILE = "medusa_lm_head.safetensors"
_KEY = re.compile(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)")


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    """What a Medusa folder's config.json says: heads, blocks per head, the base model."""

    num_heads: int
    num_layers: int
    base_model: str
    folder: Path

    @classmethod
    def read(cls, folder: Path) -> MedusaConfig | None:
        """The folder's Medusa config, or None when config.json has no `medusa_num_heads`."""
        path = folder / "config.json"
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        if "medusa_num_heads" not in raw:
            return None
        heads, layers = raw["medusa_num_heads"], raw.get("medusa_num_layers", 1)
        base = raw.get("base_model_name_or_path")
        if not (isinstance(heads, int) and heads > 0 and isinstance(layers, int) and layers >= 0):
            raise CheckpointError(
                f"{path}: medusa_num_heads must be a positive integer and medusa_num_layers a "
                f"non-negative one (got {heads!r}, {layers!r})"
            )
        if not isinstance(base, str) or not base:
            raise CheckpointError(f"{path}: a Medusa config needs base_model_name_or_path")
        if not (folder / HEADS_FILE).exists():
            raise CheckpointError(f"{folder} is a Medusa folder without {HEADS_FILE}")
        return cls(heads, layers, base, folder)


class MedusaHeads(nnx.Module):
    """M heads of B residual blocks each; `out` [M, V, D] their output projections, or None
    (V2: every head uses the base model's LM head)."""

    def __init__(self, w, b, out):
        self.w = nnx.Param(w, axes=("draft_heads", "draft_heads", "embed", "embed"))  # [M, B, D, D]
        self.b = nnx.Param(b, axes=("draft_heads", "draft_heads", "embed"))  # [M, B, D]
        self.out = None if out is None else nnx.Param(out, axes=("draft_heads", "vocab", "embed"))

    @property
    def num_heads(self) -> int:
        return self.w.shape[0]

    def __call__(self, x: jax.Array, lm_head: jax.Array, vocab_limit: int) -> jax.Array:
        """x [S, D] final hidden states (after the model's norm), lm_head [V, D] -> drafts
        [S, M] int32: head m's argmax at each position, over the tokenizer's ids only."""
        y = jnp.broadcast_to(x[:, None, :], (x.shape[0], self.num_heads, x.shape[1]))  # [S, M, D]
        w, b = self.w[...], self.b[...]
        for block in range(w.shape[1]):
            z = jnp.einsum("smd,med->sme", y, w[:, block]) + b[None, :, block]
            y = y + jax.nn.silu(z)
        if self.out is None:
            logits = jnp.einsum("smd,vd->smv", y, lm_head, preferred_element_type=jnp.float32)
        else:
            out = self.out[...]
            logits = jnp.einsum("smd,mvd->smv", y, out, preferred_element_type=jnp.float32)
        if vocab_limit < logits.shape[-1]:  # padded ids are never drafted
            ids = jnp.arange(logits.shape[-1])
            logits = jnp.where(ids < vocab_limit, logits, -jnp.inf)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def load_medusa(
    medusa: MedusaConfig, *, hidden_size: int, vocab_size: int, mesh: Mesh, dtype
) -> MedusaHeads:
    """The heads of `medusa`'s folder on `mesh`, after checking the file holds exactly what
    its config promises: every head with its blocks (weight [D, D], bias [D]) and either every
    head's output projection [V, D] (V1) or none (V2). Raises CheckpointError naming the
    tensor otherwise."""
    source = SafetensorsFile(medusa.folder / HEADS_FILE)
    heads, blocks, d = medusa.num_heads, medusa.num_layers, hidden_size
    for name in source.header:
        hit = _KEY.fullmatch(name)
        if hit is None:
            raise CheckpointError(f"{HEADS_FILE}: unexpected tensor {name!r}")
        m, b, kind = int(hit[1]), int(hit[2]), hit[3]
        if m >= heads or b > blocks or (kind == "weight") != (b == blocks):
            raise CheckpointError(
                f"{HEADS_FILE}: tensor {name!r} is outside {heads} heads of {blocks} blocks"
            )
    want = {}
    for m in range(heads):
        for b in range(blocks):
            want[f"{m}.{b}.linear.weight"], want[f"{m}.{b}.linear.bias"] = (d, d), (d,)
    missing = [name for name in want if name not in source.header]
    if missing:
        shown = ", ".join(missing[:6])
        raise CheckpointError(f"{HEADS_FILE} lacks {len(missing)} tensor(s): {shown}")
    outs = [f"{m}.{blocks}.weight" for m in range(heads)]
    lacking = [name for name in outs if name not in source.header]
    if 0 < len(lacking) < heads:
        raise CheckpointError(f"{HEADS_FILE}: some heads have output projections, not {lacking}")
    if not lacking:  # V1: every head has its own
        want |= {name: (vocab_size, d) for name in outs}

    def read(name: str) -> np.ndarray:
        array = source.read(name)
        if array.shape != want[name]:
            raise CheckpointError(
                f"{HEADS_FILE}: tensor {name!r} has shape {array.shape}, expected {want[name]}"
            )
        return np.asarray(array, dtype=dtype)

    w = np.zeros((heads, blocks, d, d), dtype)  # [M, B, D, D]
    b = np.zeros((heads, blocks, d), dtype)  # [M, B, D]
    for m in range(heads):
        for block in range(blocks):
            w[m, block] = read(f"{m}.{block}.linear.weight")
            b[m, block] = read(f"{m}.{block}.linear.bias")
    out = None if lacking else np.stack([read(name) for name in outs])  # [M, V, D]
    module = MedusaHeads(w, b, out)
    _, state = nnx.split(module)

    def put(var: nnx.Variable) -> nnx.Variable:
        value = var[...]
        return var.replace(jax.device_put(value, sharding_for(mesh, var.axes, value.shape)))

    nnx.update(module, jax.tree.map(put, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    return module
