"""Llama-family decoder (Llama 2/3/3.1/3.2, SmolLM, Mistral, Qwen2, Qwen3) as Flax NNX modules.

One forward serves prefill and decode: (token ids [T], KV pages, metadata) -> (logits, KV pages).
Families differ only by named switches in ModelConfig: qkv_bias, o_bias, mlp_bias, qk_norm,
sliding_windows, tie_word_embeddings, and the rope type. Attribute names follow transformers'
module names so the weight map in tgix/models/weights.py is rename-free. The stack only: each
layer's attention block (attention_block.py) calls the model's backend (tgix.attention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from tgix.attention.backend import AttentionBackend, backend
from tgix.attention.contract import AttentionMetadata, LayerKV
from tgix.models.attention_block import PagedAttention
from tgix.models.config import ModelConfig
from tgix.models.layers import GatedMLP, RMSNorm, rope_cos_sin


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(
        self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, dtype, attention: AttentionBackend
    ):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = PagedAttention(cfg, layer, rngs=rngs, dtype=dtype, backend=attention)
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
    `attention`: a backend, or the name of a registered one (tgix.attention.backend);
    `self.attention` is the backend every layer calls (its kv_shape and pack are the runner's)."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
        attention: str | AttentionBackend = "paged",
    ):
        self.cfg = cfg
        self.attention = backend(attention) if isinstance(attention, str) else attention
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype)
        self.layers = nnx.List(
            [
                DecoderLayer(cfg, i, rngs=rngs, dtype=dtype, attention=self.attention)
                for i in range(cfg.num_layers)
            ]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype)
        )
        self.medusa = None  # MedusaHeads, set by the loader when the checkpoint has them

    def __call__(
        self,
        token_ids: jax.Array,
        kv_pages: tuple[LayerKV, ...],
        md: AttentionMetadata,
        logits_indices: jax.Array | None = None,
        *,
        fresh_rows: bool = False,
        tokenwise_rope: bool = False,
    ) -> tuple[jax.Array, tuple[LayerKV, ...]]:
        """token_ids [T] -> logits [T, V] (or [R, V] at `logits_indices` [R]), new KV pages.

        Logits only where asked: a prefill of T tokens needs one row per request, and the
        [T, V] matmul would otherwise dominate small models. `fresh_rows` (static) promises
        that no row has KV from earlier steps (a plain prefill), which selects the page-free
        prefill attention. `tokenwise_rope` (static): each token's "dynamic" rope base is the
        one it would get decoded alone (KV length = position + 1), so a verify step's drafts
        are scored exactly as plain decode steps would score them.
        """
        x, new_pages = self.hidden_states(
            token_ids, kv_pages, md, logits_indices,
            fresh_rows=fresh_rows, tokenwise_rope=tokenwise_rope,
        )  # fmt: skip
        return self.logits(x), new_pages

    def hidden_states(
        self,
        token_ids: jax.Array,
        kv_pages: tuple[LayerKV, ...],
        md: AttentionMetadata,
        logits_indices: jax.Array | None = None,
        *,
        fresh_rows: bool = False,
        tokenwise_rope: bool = False,
    ) -> tuple[jax.Array, tuple[LayerKV, ...]]:
        """The final normed hidden states [T, D] (or [R, D] at `logits_indices`), new KV
        pages: what the LM head and any Medusa heads (tgix/models/medusa.py) read."""
        context_lens = md.positions + 1 if tokenwise_rope else md.kv_lens[md.token_rows]  # [T]
        cos, sin = rope_cos_sin(self.cfg, md.positions, context_lens)  # [T, H] each
        x = self.embed_tokens(token_ids)  # [T, D]
        new_pages = []
        for layer, kv in zip(self.layers, kv_pages, strict=True):
            x, kv = layer(x, cos, sin, kv, md, fresh_rows)
            new_pages.append(kv)
        if logits_indices is not None:
            x = x[logits_indices]  # [R, D]
        return self.norm(x), tuple(new_pages)

    def head_weight(self) -> jax.Array:
        """The LM head [V, D] (the embedding table when tied)."""
        head = self.embed_tokens.embedding if self.lm_head is None else self.lm_head.weight
        return head[...]

    def logits(self, x: jax.Array) -> jax.Array:
        """x [T, D] normed hidden states -> logits [T, V] float32."""
        logits = jnp.einsum("td,vd->tv", x, self.head_weight(), preferred_element_type=jnp.float32)
        return logits.astype(jnp.float32)
