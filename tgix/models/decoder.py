"""The decoder every family shares (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, Mixtral,
Qwen2/3-MoE) as Flax NNX modules.

One forward serves prefill and decode: (token ids [T], KV pages, metadata) -> (logits, KV pages).
Families differ only by named switches in ModelConfig (read by tgix/models/families/): biases,
q/k norms, sliding windows, tied embeddings, the rope (and Gemma 3's second rope for sliding
layers), Gemma's scaled embeddings, four norms a block and soft-capped logits, and MoE layers
(tgix/models/moe.py) in place of the dense MLP. Attribute names follow transformers' module
names so the weight tables are rename-free. The stack only: each layer's attention block
(attention_block.py) calls the model's backend (tgix.attention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from tgix.attention.backend import AttentionBackend, backend
from tgix.attention.contract import AttentionMetadata, LayerKV
from tgix.models import cpu_int8
from tgix.models.attention_block import PagedAttention
from tgix.models.config import ModelConfig
from tgix.models.layers import GatedMLP, mrope_cos_sin, norm, rope_cos_sin
from tgix.models.moe import SparseMoE
from tgix.models.out_major import out_major_matmul

# Rows of logits for which the LM head is computed as [V, D] x [D, T] then transposed, on
# XLA:CPU: YNNPACK runs that dot 15-35% faster than [T, D] x [D, V] from 2 to 64 rows (the
# default model's head, 49,152 x 576: 8 rows 9.4 -> 6.3 ms, 32 rows 16.5 -> 11.8 ms), and
# slower from 128 (43 -> 52 ms); one row stays a GEMV (3.4 ms against 4.5). BENCHMARKS.md,
# "Dot layouts on XLA:CPU".
HEAD_TRANSPOSED_ROWS = (2, 64)


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)). With sandwich norms (Gemma)
    each sublayer's output is normed too before it joins the residual; transformers names
    Llama's pre-MLP norm post_attention_layernorm, Gemma's pre_feedforward_layernorm."""

    def __init__(
        self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, dtype, attention: AttentionBackend
    ):
        d = cfg.hidden_size
        self.sandwich = cfg.sandwich_norms
        self.local = cfg.local_rope is not None and cfg.sliding_windows[layer] is not None
        self.input_layernorm = norm(cfg, d, dtype=dtype)
        self.self_attn = PagedAttention(cfg, layer, rngs=rngs, dtype=dtype, backend=attention)
        self.post_attention_layernorm = norm(cfg, d, dtype=dtype)
        self.pre_feedforward_layernorm = norm(cfg, d, dtype=dtype) if self.sandwich else None
        self.post_feedforward_layernorm = norm(cfg, d, dtype=dtype) if self.sandwich else None
        sparse = bool(cfg.moe_layers) and cfg.moe_layers[layer]
        self.mlp = (SparseMoE if sparse else GatedMLP)(cfg, rngs=rngs, dtype=dtype)

    def __call__(self, x, ropes, kv: LayerKV, md: AttentionMetadata, fresh_rows: bool):
        """x [T, D]; ropes: ((cos, sin) of the global rope, of the local one or None).
        Returns (x [T, D], kv, the MoE block's expert load [E] or None)."""
        cos, sin = ropes[1] if self.local else ropes[0]
        attn_out, kv = self.self_attn(self.input_layernorm(x), cos, sin, kv, md, fresh_rows)
        if self.sandwich:
            x = x + self.post_attention_layernorm(attn_out)
            h, load = self._feed(self.pre_feedforward_layernorm(x), md)
            return x + self.post_feedforward_layernorm(h), kv, load
        x = x + attn_out
        h, load = self._feed(self.post_attention_layernorm(x), md)
        return x + h, kv, load

    def _feed(self, h, md: AttentionMetadata):
        if isinstance(self.mlp, SparseMoE):
            return self.mlp(h, md.cu_q_lens[-1])
        return self.mlp(h), None


class Embed(nnx.Module):
    """Token embedding [V, D]; also the LM head when embeddings are tied. `scale` (Gemma:
    sqrt(D), in the parameter dtype as transformers rounds it) multiplies the lookups only."""

    def __init__(self, vocab_size: int, hidden_size: int, *, rngs: nnx.Rngs, dtype, scale=None):
        init = jax.random.normal(rngs.params(), (vocab_size, hidden_size), jnp.float32)
        self.embedding = nnx.Param(init.astype(dtype), axes=("vocab", "embed"))
        self.scale = scale

    def __call__(self, token_ids: jax.Array) -> jax.Array:
        x = jnp.take(self.embedding[...], token_ids, axis=0)  # [T, D]
        return x if self.scale is None else x * jnp.asarray(self.scale, x.dtype)


class LMHead(nnx.Module):
    """Untied output projection, kept in transformers' [V, D] layout (no transpose at load)."""

    def __init__(self, vocab_size: int, hidden_size: int, *, rngs: nnx.Rngs, dtype):
        init = hidden_size**-0.5 * jax.random.normal(rngs.params(), (vocab_size, hidden_size))
        self.weight = nnx.Param(init.astype(dtype), axes=("vocab", "embed"))


class CausalLM(nnx.Module):
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
        self.embed_tokens = Embed(
            cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype, scale=cfg.embed_scale
        )
        self.layers = nnx.List(
            [
                DecoderLayer(cfg, i, rngs=rngs, dtype=dtype, attention=self.attention)
                for i in range(cfg.num_layers)
            ]
        )
        self.norm = norm(cfg, cfg.hidden_size, dtype=dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else LMHead(cfg.vocab_size, cfg.hidden_size, rngs=rngs, dtype=dtype)
        )
        self.medusa = None  # MedusaHeads, set by the loader when the checkpoint has them
        # [V, D] bfloat16 copy of the head, set by the loader when the linear layers run
        # tgix's int8 CPU kernel (--quantize eetq on one CPU device): see logits()
        self.head_bf16: nnx.Param | None = None

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
        with_load: bool = False,
        image_embeds: tuple[jax.Array, jax.Array] | None = None,
        rope_positions: jax.Array | None = None,
    ) -> tuple:
        """The final normed hidden states [T, D] (or [R, D] at `logits_indices`), new KV
        pages (x, pages): what the LM head and any Medusa heads (tgix/models/medusa.py)
        read. With `with_load` (static) (x, pages, load): also the expert load, routed
        assignments per expert [E] int32 summed over the MoE layers (None if dense).
        `image_embeds` (embeddings [T, D] float32, marked [T] bool): a vision prompt's image
        features replace the token embeddings where marked (its image tokens).
        `rope_positions` [3, T] int32: an M-RoPE model's (time, height, width) positions
        (tgix/models/layers.mrope_cos_sin); None: md.positions on every row."""
        context_lens = md.positions + 1 if tokenwise_rope else md.kv_lens[md.token_rows]  # [T]
        cfg = self.cfg
        if cfg.mrope_section:
            if rope_positions is None:
                rope_positions = jnp.broadcast_to(md.positions, (3, *md.positions.shape))
            ropes = (mrope_cos_sin(cfg, rope_positions, context_lens), None)
        else:
            ropes = (  # cos, sin [T, H'] each, of the rope and of the sliding layers' own
                rope_cos_sin(cfg, md.positions, context_lens),
                cfg.local_rope and rope_cos_sin(cfg, md.positions, context_lens, cfg.local_rope),
            )
        x = self.embed_tokens(token_ids)  # [T, D]
        if image_embeds is not None:
            embeds, marked = image_embeds
            x = jnp.where(marked[:, None], embeds.astype(x.dtype), x)
        new_pages, loads = [], []
        for layer, kv in zip(self.layers, kv_pages, strict=True):
            x, kv, load = layer(x, ropes, kv, md, fresh_rows)
            new_pages.append(kv)
            loads += [] if load is None else [load]
        if logits_indices is not None:
            x = x[logits_indices]  # [R, D]
        if with_load:
            return self.norm(x), tuple(new_pages), (sum(loads) if loads else None)
        return self.norm(x), tuple(new_pages)

    def head_weight(self) -> jax.Array:
        """The LM head [V, D] (the embedding table when tied)."""
        head = self.embed_tokens.embedding if self.lm_head is None else self.lm_head.weight
        return head[...]

    def logits(self, x: jax.Array) -> jax.Array:
        """x [T, D] normed hidden states -> logits [T, V] float32 (Gemma 2: soft-capped).
        With `head_bf16` the product reads that copy through cpu_int8's kernel: the float32
        head is about half of what an int8 decode step reads, and its bfloat16 copy runs a
        1-row step's head in 0.4x the time (BENCHMARKS.md, "A native int8 kernel on CPU")."""
        if self.head_bf16 is not None:
            logits = cpu_int8.bf16_matmul(x, self.head_bf16[...])
        else:
            logits = out_major_matmul(  # the head [V, D] is out-major
                x, self.head_weight(), HEAD_TRANSPOSED_ROWS, preferred_element_type=jnp.float32
            )
        cap = self.cfg.final_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)
