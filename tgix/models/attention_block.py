"""The attention block shared by the decoders: projections, q/k norm, rope, then the backend.

Attribute names follow transformers' module names (q_proj, k_proj, v_proj, o_proj, q_norm,
k_norm) so the weight tables (tgix/models/families/) are rename-free. Family switches read
here: biases, q/k norms, the sliding window, Gemma's query scale and score soft-capping.
"""

from __future__ import annotations

from flax import nnx

from tgix.attention.backend import AttentionBackend
from tgix.attention.contract import AttentionMetadata, LayerKV, is_fp8
from tgix.models.config import ModelConfig
from tgix.models.layers import Dense, apply_rope, norm


class PagedAttention(nnx.Module):
    """Grouped-query self-attention over the paged KV cache; `backend` writes the step's K/V
    into its pages and attends."""

    def __init__(
        self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, dtype, backend: AttentionBackend
    ):
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
        self.q_norm = norm(cfg, h, dtype=dtype) if cfg.qk_norm else None
        self.k_norm = norm(cfg, h, dtype=dtype) if cfg.qk_norm else None
        self.sliding_window = cfg.sliding_windows[layer] if cfg.sliding_windows else None
        # backends score q.k * H^-0.5: a family's own scale (Gemma) is folded into q
        self.q_scale = 1.0 if cfg.attn_scale is None else cfg.attn_scale * h**0.5
        self.softcap = cfg.attn_softcap
        # fp8 KV: the checkpoint's per-layer (k_scale, v_scale) (tgix/models/kv_scales.py);
        # pages hold k / k_scale and v / v_scale. Static; ignored with other KV dtypes.
        self.kv_scales: tuple[float, float] = (1.0, 1.0)

    def __call__(self, x, cos, sin, kv: LayerKV, md: AttentionMetadata, fresh_rows: bool):
        """x [T, D], cos/sin [T, H] -> ([T, D], updated LayerKV). `fresh_rows` (static): every
        row starts at position 0, so attention needs only this step's K/V (no page reads)."""
        t, n, h = x.shape[0], self.num_heads, self.head_dim
        kv_shape = (t, self.num_kv_heads, h)
        q = self.q_proj(x).reshape(t, n, h)  # [T, N, H]
        k, v = self.k_proj(x).reshape(kv_shape), self.v_proj(x).reshape(kv_shape)  # [T, K, H]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_scale, v_scale = self.kv_scales if is_fp8(kv.k.dtype) else (1.0, 1.0)
        if (k_scale, v_scale) != (1.0, 1.0):
            # pages of k / ks and v / vs, attended by q * ks: scores q.k and the output
            # softmax . v / vs, rescaled below, are the unscaled ones; no backend sees scales
            k, v = k / k_scale, v / v_scale
        if self.q_scale * k_scale != 1.0:  # one multiply for both
            q = q * (self.q_scale * k_scale)
        out, kv = self.backend(
            q, k, v, kv, md, fresh=fresh_rows, sliding_window=self.sliding_window,
            softcap=self.softcap,
        )  # fmt: skip
        if v_scale != 1.0:
            out = out * v_scale
        return self.o_proj(out.reshape(t, n * h)), kv
