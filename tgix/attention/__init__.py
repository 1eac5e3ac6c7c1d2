"""Attention backends over the paged KV cache.

contract.py  what every backend shares: AttentionMetadata, LayerKV, the KV page layout, write_kv
backend.py   the AttentionBackend protocol, the "paged" (XLA) and "reference" backends, registry
pack.py      host only (numpy): one step's rows -> metadata arrays (the backends' `pack`)
xla.py, xla_mixed.py  the XLA paths: fresh-row prefill, paged decode, mixed steps
reference.py the oracle

Nothing is imported here, so `tgix.attention.pack` stays free of jax.
"""
