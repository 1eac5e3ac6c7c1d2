"""Pure, `jax.jit`-compatible batched generation for JAX users: prompts in, tokens out.

`generate(graphdef, params, prompt_ids, prompt_lens, max_new_tokens=...)` runs the same paged
decoder the engine serves, but with everything the host packer (tgix.attention.pack.pack_step)
does rebuilt from device arrays, so the whole loop is one XLA program that can be jitted on
its own or traced inside other jitted JAX code:

- KV cache: B * P + 1 pages of `page_size` tokens (page 0 is the null page), row b owning the
  contiguous pages 1 + b*P .. (b+1)*P, so the page table is a constant. P covers the longest
  row: T prompt tokens + max_new_tokens - 1 fed-back tokens (the last token is never fed).
- Prefill: one step over the B right-padded prompts packed tightly on a [B*T] token axis (real
  tokens first, row by row, padding at the end writing to the null page), exactly as
  pack_step lays out a step, with logits read at each row's last prompt token.
- Decode: a `lax.while_loop` of one-token-per-row steps [B] that stops once every row produced
  an EOS id or max_new_tokens tokens.

Shape letters: B rows (prompts), T prompt tokens (padded), S KV length per row = P * page_size,
V vocabulary, P pages per row, N = max_new_tokens, E number of EOS ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from tgix.attention.contract import AttentionMetadata, LayerKV

__all__ = ["STATIC_ARGNAMES", "GenerateOutput", "generate", "jit_generate", "split_model"]

# Arguments of `generate` that set array shapes or Python control flow: static under jax.jit.
STATIC_ARGNAMES = ("max_new_tokens", "top_k", "page_size", "kv_dtype")


class GenerateOutput(NamedTuple):
    """tokens [B, N] int32: row b's new tokens are tokens[b, :lengths[b]] (the EOS included when
    it stopped the row); later entries hold the first EOS id (0 when there is none).
    lengths [B] int32: how many tokens each row generated, 1..N."""

    tokens: jax.Array
    lengths: jax.Array


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) for `generate`: the static structure and the array state."""
    return nnx.split(model)


def generate(
    model_def: nnx.GraphDef,
    params: nnx.State,
    prompt_ids: jax.Array,
    prompt_lens: jax.Array,
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int] | jax.Array | None = None,
    temperature: float | jax.Array = 0.0,
    top_k: int = 0,
    key: jax.Array | None = None,
    page_size: int = 16,
    kv_dtype=None,
) -> GenerateOutput:
    """Continue B right-padded prompts by up to `max_new_tokens` tokens each.

    prompt_ids [B, T] int32, right-padded; prompt_lens [B] int32, each in 1..T.
    eos_id: one id, several ids [E] (a row stops at any of them), or None (never stop early);
      may be traced. temperature: 0 = greedy (argmax); > 0 samples from softmax(logits / t),
      restricted to the `top_k` most likely tokens when top_k > 0; may be a traced scalar, in
      which case `key` is required even if it turns out 0. key: a PRNG key; step i samples with
      fold_in(key, i), so a fixed key reproduces the output. kv_dtype defaults to the model's
      parameter dtype. Static under jit: max_new_tokens, top_k, page_size, kv_dtype
      (STATIC_ARGNAMES).
    """
    model = nnx.merge(model_def, params)
    cfg = model.cfg
    batch, prompt_width = prompt_ids.shape
    prompt_ids = prompt_ids.astype(jnp.int32)
    prompt_lens = prompt_lens.astype(jnp.int32)
    greedy_only = isinstance(temperature, int | float) and temperature == 0
    if not greedy_only and key is None:
        raise ValueError("sampling (temperature not statically 0) needs a PRNG `key`")
    eos_ids = None if eos_id is None else jnp.atleast_1d(jnp.asarray(eos_id, jnp.int32))  # [E]
    fill_id = jnp.int32(0) if eos_ids is None else eos_ids[0]

    pages_per_row = -(-(prompt_width + max_new_tokens - 1) // page_size)
    first_page = 1 + jnp.arange(batch, dtype=jnp.int32) * pages_per_row  # [B]
    page_table = first_page[:, None] + jnp.arange(pages_per_row, dtype=jnp.int32)  # [B, P]
    dtype = kv_dtype or model.embed_tokens.embedding[...].dtype
    num_pages = batch * pages_per_row + 1
    shape = model.attention.kv_shape(num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
    kv_pages = tuple(
        LayerKV(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)
    )

    def pick(logits: jax.Array, step: jax.Array) -> jax.Array:
        """Next token [B] from logits [B, V] (float32)."""
        greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        if greedy_only:
            return greedy
        if top_k > 0:
            kth = jax.lax.top_k(logits, top_k)[0][:, -1:]  # [B, 1]
            logits = jnp.where(logits >= kth, logits, -jnp.inf)
        safe_t = jnp.maximum(jnp.asarray(temperature, jnp.float32), 1e-6)
        sampled = jax.random.categorical(jax.random.fold_in(key, step), logits / safe_t, axis=-1)
        return jnp.where(temperature > 0, sampled.astype(jnp.int32), greedy)

    def is_eos(tokens: jax.Array) -> jax.Array:
        """[B] bool."""
        if eos_ids is None:
            return jnp.zeros(tokens.shape, bool)
        return jnp.any(tokens[:, None] == eos_ids[None, :], axis=-1)

    # Prefill: rows packed tightly on [B*T] like pack_step; padding tokens go to the null slot.
    cu_q_lens = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(prompt_lens)])  # [B+1]
    flat = jnp.arange(batch * prompt_width, dtype=jnp.int32)  # [B*T]
    real = flat < cu_q_lens[-1]
    rows = jnp.clip(jnp.searchsorted(cu_q_lens[1:], flat, side="right"), 0, batch - 1)
    positions = jnp.where(real, flat - cu_q_lens[rows], 0)
    rows = jnp.where(real, rows, 0).astype(jnp.int32)
    md = AttentionMetadata(
        positions=positions,
        slot_mapping=jnp.where(real, first_page[rows] * page_size + positions, 0),
        token_rows=rows,
        cu_q_lens=cu_q_lens,
        kv_lens=prompt_lens,
        page_table=page_table,
    )
    token_ids = jnp.where(real, prompt_ids[rows, positions], 0)
    # every row starts at 0: page-free prefill attention
    logits, kv_pages = model(token_ids, kv_pages, md, cu_q_lens[1:] - 1, fresh_rows=True)  # [B, V]
    first = pick(logits, jnp.int32(0))
    tokens = jnp.full((batch, max_new_tokens), fill_id, jnp.int32).at[:, 0].set(first)
    done = is_eos(first) | (max_new_tokens == 1)
    lengths = jnp.ones(batch, jnp.int32)

    def keep_going(carry) -> jax.Array:
        step, _, _, done, _, _ = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def decode(carry):
        """Feed token step-1 of every row (at position prompt_len + step - 1); pick token step."""
        step, last, kv_pages, done, tokens, lengths = carry
        positions = prompt_lens + step - 1  # [B]
        md = AttentionMetadata(
            positions=positions,
            slot_mapping=first_page * page_size + positions,  # finished rows: own pages, unread
            token_rows=jnp.arange(batch, dtype=jnp.int32),
            cu_q_lens=jnp.arange(batch + 1, dtype=jnp.int32),
            kv_lens=positions + 1,
            page_table=page_table,
        )
        logits, kv_pages = model(last, kv_pages, md)  # [B, V]
        new = jnp.where(done, fill_id, pick(logits, step))
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, new, step, axis=1)
        lengths = jnp.where(done, lengths, step + 1)
        done = done | is_eos(new) | (step + 1 >= max_new_tokens)
        return step + 1, new, kv_pages, done, tokens, lengths

    carry = (jnp.int32(1), first, kv_pages, done, tokens, lengths)
    _, _, _, _, tokens, lengths = jax.lax.while_loop(keep_going, decode, carry)
    return GenerateOutput(tokens, lengths)


# generate, compiled once per (shapes, static arguments); prompt contents, eos ids, temperature
# and key are traced, so changing them does not recompile.
jit_generate = jax.jit(generate, static_argnames=STATIC_ARGNAMES)
