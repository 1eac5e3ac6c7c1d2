"""The routed mixture-of-experts block (Mixtral, Qwen2-MoE, Qwen3-MoE).

Each token's router probabilities (softmax in float32 over E experts) pick its top-k experts;
their outputs are summed with the top-k probabilities as weights (renormalised to sum to 1
when the family does). Three ways to compute the experts, all equal to transformers' loop:

  sorted  the (token, expert) assignments sorted by expert, cut into blocks of B rows that
          each belong to one expert (each expert's run padded to a multiple of B); a loop
          over the blocks actually used does B x D x F matmuls with that expert's weights.
          Work: about (T * k + E * B) rows instead of T * E. The CPU default.
  ragged  the same sorted rows through jax.lax.ragged_dot (a grouped matmul on TPU and GPU;
          XLA:CPU lowers it densely, every expert for every row). The GPU/TPU default.
  dense   every expert for every token, weighted by a [T, E] combine matrix: E / k times the
          FLOPs, but only local einsums, so it is the path when experts are split over the
          mesh's model axis (an expert axis: each device computes its own experts, one
          all-reduce joins them).

Each call also returns the expert load (routed assignments per expert [E], real tokens
only); the decoder sums it over layers and the engine reports it (engine stats).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

from tgix.models.config import ModelConfig
from tgix.models.layers import ACTIVATIONS, GatedMLP, param

IMPLS = ("sorted", "ragged", "dense")
MAX_BLOCK = 64  # rows of one sorted block at most


def default_impl() -> str:
    """env TGIX_MOE_IMPL, else sorted on CPU and ragged elsewhere."""
    return os.environ.get("TGIX_MOE_IMPL") or (
        "sorted" if jax.default_backend() == "cpu" else "ragged"
    )


class SparseMoE(nnx.Module):
    """[T, D] -> [T, D]. router [E, D] (HF layout), gate/up kernels [E, D, F], down [E, F, D];
    Qwen2-MoE's shared expert (a GatedMLP) and its gate [1, D] when configured."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype):
        e, d, f = cfg.num_experts, cfg.hidden_size, cfg.expert_size
        self.top_k, self.renormalize, self.hidden_act = (
            cfg.experts_per_token, cfg.norm_topk_prob, cfg.hidden_act
        )  # fmt: skip
        self.impl = default_impl()  # static; the loader picks dense for an expert axis
        if self.impl not in IMPLS:
            raise ValueError(f"TGIX_MOE_IMPL={self.impl!r}: one of {', '.join(IMPLS)}")
        self.router = param(rngs, (e, d), ("router", "embed"), dtype, d**-0.5)
        in_axes, out_axes = ("experts", "embed", "expert_mlp"), ("experts", "expert_mlp", "embed")
        self.gate_kernel = param(rngs, (e, d, f), in_axes, dtype, d**-0.5)
        self.up_kernel = param(rngs, (e, d, f), in_axes, dtype, d**-0.5)
        self.down_kernel = param(rngs, (e, f, d), out_axes, dtype, f**-0.5)
        shared = cfg.shared_expert_size
        self.shared_expert = GatedMLP(cfg, rngs=rngs, dtype=dtype, width=shared) if shared else None
        self.shared_expert_gate = (
            param(rngs, (1, d), ("router", "embed"), dtype, d**-0.5) if shared else None
        )

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [T, D] -> top-k expert ids [T, k] int32 and their weights [T, k] float32."""
        # float32 logits (transformers computes them in the model dtype, then softmaxes in
        # float32: in bfloat16 a near-tie may route differently)
        logits = jnp.einsum(
            "td,ed->te", x.astype(jnp.float32), self.router[...].astype(jnp.float32)
        )  # [T, E] float32
        probs = jax.nn.softmax(logits, axis=-1)
        weights, ids = jax.lax.top_k(probs, self.top_k)  # ties: the lower id first
        if self.renormalize:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return ids.astype(jnp.int32), weights

    def __call__(self, x: jax.Array, num_real: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [T, D] -> ([T, D], load [E] int32). num_real: tokens [0, num_real) are real (the
        rest padding, not counted in the load and, with `sorted`, not computed)."""
        ids, weights = self.route(x)
        t, k = ids.shape
        e = self.router.shape[0]
        real = (jnp.arange(t * k, dtype=jnp.int32) // k) < num_real  # [A]
        flat_ids = jnp.where(real, ids.reshape(-1), e)  # padding -> expert E (none)
        load = jnp.bincount(flat_ids, length=e + 1)[:e].astype(jnp.int32)  # [E]
        weights = weights.astype(x.dtype)
        if self.impl == "dense":
            out = self._dense(x, ids, weights)
        else:  # the assignments sorted by expert [A]: their tokens and weights
            order = jnp.argsort(flat_ids, stable=True)
            token_of, weight_of = order // k, weights.reshape(-1)[order]
            path = self._ragged if self.impl == "ragged" else self._blocks
            out = path(x, token_of, weight_of, load)
        if self.shared_expert is not None:
            gate = jax.nn.sigmoid(jnp.einsum("td,od->to", x, self.shared_expert_gate[...]))
            out = out + gate * self.shared_expert(x)
        return out, load

    def _experts(self, xs: jax.Array, e: jax.Array) -> jax.Array:
        """One expert's MLP on rows xs [B, D] -> [B, D] (e: its index)."""
        act = ACTIVATIONS[self.hidden_act]
        gate, up, down = (w[...][e] for w in (self.gate_kernel, self.up_kernel, self.down_kernel))
        return (act(xs @ gate) * (xs @ up)) @ down

    def _dense(self, x, ids, weights):
        act = ACTIVATIONS[self.hidden_act]
        h = act(jnp.einsum("td,edf->tef", x, self.gate_kernel[...]))
        h = h * jnp.einsum("td,edf->tef", x, self.up_kernel[...])  # [T, E, F]
        y = jnp.einsum("tef,efd->ted", h, self.down_kernel[...])  # [T, E, D]
        rows = jnp.arange(x.shape[0])[:, None]
        combine = jnp.zeros((x.shape[0], y.shape[1]), x.dtype).at[rows, ids].add(weights)
        return jnp.einsum("ted,te->td", y, combine)

    def _ragged(self, x, token_of, weight_of, load):
        """token_of, weight_of [A] sorted by expert, load [E]: one grouped matmul each."""
        xs = x[token_of]  # [A, D]; rows past sum(load) are padding: no group, output 0
        act = ACTIVATIONS[self.hidden_act]
        rd = lambda lhs, w: jax.lax.ragged_dot(lhs, w, load)
        h = act(rd(xs, self.gate_kernel[...])) * rd(xs, self.up_kernel[...])
        y = rd(h, self.down_kernel[...]) * weight_of[:, None]
        return jnp.zeros_like(x).at[token_of].add(y)

    def _blocks(self, x, token_of, weight_of, load):
        """The same rows in blocks of one expert each, only the blocks used."""
        a, e = token_of.shape[0], load.shape[0]
        starts = jnp.cumsum(load) - load  # [E] first sorted row of each expert
        block = _block_rows(a, e)
        blocks_of = (load + block - 1) // block  # [E]
        block_end = jnp.cumsum(blocks_of)  # [E] blocks up to and including each expert

        def body(j, out):
            expert = jnp.searchsorted(block_end, j, side="right").astype(jnp.int32)
            first = starts[expert] + (j - (block_end[expert] - blocks_of[expert])) * block
            rows = first + jnp.arange(block, dtype=jnp.int32)  # [B] sorted rows
            valid = rows < starts[expert] + load[expert]
            rows = jnp.minimum(rows, a - 1)
            tokens = token_of[rows]
            y = self._experts(x[tokens], expert)  # [B, D]
            y = jnp.where(valid[:, None], y * weight_of[rows][:, None], 0)  # no 0 * inf
            return out.at[tokens].add(y)

        return jax.lax.fori_loop(0, block_end[-1], body, jnp.zeros_like(x))


def _block_rows(assignments: int, experts: int) -> int:
    """B: the power of two nearest above the mean rows per expert, at most MAX_BLOCK. Each
    expert's weights are read once per block: decode steps (few rows an expert) get one
    block per expert used, prompts blocks of MAX_BLOCK rows."""
    mean = max(1, -(-assignments // experts))
    return min(MAX_BLOCK, 1 << (mean - 1).bit_length())


def set_moe_impl(model: nnx.Module, impl: str) -> None:
    """Every SparseMoE of `model` computes its experts by `impl` (one of IMPLS)."""
    for _, module in nnx.iter_graph(model):
        if isinstance(module, SparseMoE):
            module.impl = impl
