"""Llama-family decoder (Llama 2/3/3.1/3.2, SmolLM, Mistral, Qwen2, Qwen3) as Flax NNX modules.

One forward serves prefill and decode: (token ids [T], KV pages, metadata) -> (logits, KV pages).
Families differ only by named switches in ModelConfig: qkv_bias, o_bias, mlp_bias, qk_norm,
sliding_windows, tie_word_embeddings, and the rope type. Attribute names follow transformers'
module names so the weight map in tgix/models/weights.py is rename-free.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from tgix.models.attention import (
    ATTENTION_BACKENDS,
    AttentionMetadata,
    prefill_attention,
    write_kv,
)
from tgix.models.attention_mixed import mixed_attention
from tgix.models.config import ModelConfig
from tgix.models.layers import Dense, GatedMLP, RMSNorm, apply_rope, rope_cos_sin


class LayerKV(NamedTuple):
    """One layer's KV pages: k and v, each [num_pages, page_size, K, H]."""

    k: jax.Array
    v: jax.Array


class Attention(nnx.Module):
    """Grouped-query self-attention over the paged KV cache."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, dtype, backend: str):
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.backend = backend
        # Kernels are 2-D with the heads flattened ([D, N*H], [N*H, D]): plain matmuls. With
        # separate head axes XLA:CPU re-lays o_proj's [N, H, D] kernel out on every step (a
        # copy of every layer's weights, half of a batch-1 decode step).
        self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
        qkv = dict(bias=cfg.qkv_bias, rngs=rngs, dtype=dtype)
        self.q_proj = Dense("td,df->tf", (d, n * h), ("embed", "heads"), **qkv)
        self.k_proj = Dense("td,df->tf", (d, k * h), ("embed", "kv_heads"), **qkv)
        self.v_proj = Dense("td,df->tf", (d, k * h), ("embed", "kv_heads"), **qkv)
        self.o_proj = Dense(
            "tf,fd->td", (n * h, d), ("heads", "embed"), bias=cfg.o_bias, rngs=rngs, dtype=dtype
        )
        self.q_norm = RMSNorm(h, cfg.rms_norm_eps, dtype=dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(h, cfg.rms_norm_eps, dtype=dtype) if cfg.qk_norm else None
        self.sliding_window = cfg.sliding_windows[layer] if cfg.sliding_windows else None

    def __call__(self, x, cos, sin, kv: LayerKV, md: AttentionMetadata, fresh_rows: bool):
        """x [T, D], cos/sin [T, H] -> ([T, D], updated LayerKV). `fresh_rows`: every row
        starts at position 0, so attention needs only this step's K/V (no page reads)."""
        t, n, h = x.shape[0], self.num_heads, self.head_dim
        kv_shape = (t, self.num_kv_heads, h)
        q = self.q_proj(x).reshape(t, n, h)  # [T, N, H]
        k, v = self.k_proj(x).reshape(kv_shape), self.v_proj(x).reshape(kv_shape)  # [T, K, H]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv = LayerKV(write_kv(kv.k, k, md.slot_mapping), write_kv(kv.v, v, md.slot_mapping))
        if fresh_rows:
            out = prefill_attention(q, k, v, md, sliding_window=self.sliding_window)
        elif self.backend == "paged" and t > md.kv_lens.shape[0]:  # prompt chunks in the step
            out = mixed_attention(q, k, v, kv.k, kv.v, md, sliding_window=self.sliding_window)
        else:
            attend = ATTENTION_BACKENDS[self.backend]
            out = attend(q, kv.k, kv.v, md, sliding_window=self.sliding_window)
        return self.o_proj(out.reshape(t, n * h)), kv


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, dtype, backend: str):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(cfg, layer, rngs=rngs, dtype=dtype, backend=backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.mlp = GatedMLP(cfg, rngs=rngs, dtype=dtype)

    def __call__(self, x, cos, sin, kv: LayerKV, md: AttentionMetadata, fresh_rows: bool):
        attn_out, kv = self.self_attn(self.input_layernorm(x), cos, sin, kv, md, fresh_rows)
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Embed(nnx.Module):
    """Token embedding [V, D]; also the LM head when embeddings are tied."""

    def __init__(self, vocab_size: int, hidden_size: int, *, rngs: nnx.Rngs, dtype):
        init = jax.random.normal(rngs.params(), (vocab_size, hidden_size), jnp.float32)
        self.embedding = nnx.Param(init.astype(dtype), axes=("vocab", "embed"))

    def __call__(self, token_ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], token_ids, axis=0)  # [T, D]


class LMHead(nnx.Module):
    """Untied output projection, kept in transformers' [V, D] layout (no transpose at load)."""

    def __init__(self, vocab_size: int, hidden_size: int, *, rngs: nnx.Rngs, dtype):
        init = hidden_size**-0.5 * jax.random.normal(rngs.params(), (vocab_size, hidden_size))
        self.weight = nnx.Param(init.astype(dtype), axes=("vocab", "embed"))


class LlamaForCausalLM(nnx.Module):
    """The decoder. `dtype` is the parameter and activation dtype; logits are float32.
    `attention` names an entry of ATTENTION_BACKENDS (all share the paged contract)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, attention="paged"):
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention backend {attention!r}; known: {sorted(ATTENTION_BACKENDS)}"
            )
        self.cfg = cfg
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype)
        self.layers = nnx.List(
            [
                DecoderLayer(cfg, i, rngs=rngs, dtype=dtype, backend=attention)
                for i in range(cfg.num_layers)
            ]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype)
        )

    def __call__(
        self,
        token_ids: jax.Array,
        kv_pages: tuple[LayerKV, ...],
        md: AttentionMetadata,
        logits_indices: jax.Array | None = None,
        *,
        fresh_rows: bool = False,
    ) -> tuple[jax.Array, tuple[LayerKV, ...]]:
        """token_ids [T] -> logits [T, V] (or [R, V] at `logits_indices` [R]), new KV pages.

        Logits only where asked: a prefill of T tokens needs one row per request, and the
        [T, V] matmul would otherwise dominate small models. `fresh_rows` (static) promises
        that no row has KV from earlier steps (a plain prefill), which selects the page-free
        prefill attention.
        """
        context_lens = md.kv_lens[md.token_rows]  # [T]
        cos, sin = rope_cos_sin(self.cfg, md.positions, context_lens)  # [T, H] each
        x = self.embed_tokens(token_ids)  # [T, D]
        new_pages = []
        for layer, kv in zip(self.layers, kv_pages, strict=True):
            x, kv = layer(x, cos, sin, kv, md, fresh_rows)
            new_pages.append(kv)
        if logits_indices is not None:
            x = x[logits_indices]  # [R, D]
        x = self.norm(x)
        head = self.embed_tokens.embedding if self.lm_head is None else self.lm_head.weight
        logits = jnp.einsum("td,vd->tv", x, head[...], preferred_element_type=jnp.float32)
        return logits.astype(jnp.float32), tuple(new_pages)
