"""Start-up sizing of the KV cache on CPU: the default budget takes at most what the batch
limits can use (max_batch_size x max_total_tokens), so a small server on a shared machine
leaves the rest of RAM alone; an explicit --max-batch-total-tokens and accelerators keep
TGI's "largest that fits"."""

from __future__ import annotations

from tgix.engine.limits import (
    CPU_CHUNK_TOKENS,
    CPU_MAX_BATCH_SIZE,
    LimitRequest,
    resolve_limits,
)


def _total(req: LimitRequest, *, budget: int, on_cpu: bool = True) -> int:
    limits = resolve_limits(req, max_position_embeddings=8192, kv_budget=budget, on_cpu=on_cpu)
    return limits.max_batch_total_tokens


def test_cpu_default_is_capped_by_the_batch_limits():
    small = LimitRequest(
        max_batch_size=4, max_total_tokens=1000, max_input_tokens=900, max_batch_prefill_tokens=900
    )
    assert _total(small, budget=1_000_000) == 4 * 1000  # whole pages: 4000 = 250 x 16
    assert _total(small, budget=3_008) == 3_008  # less memory than that: what fits
    assert _total(small, budget=1_000_000, on_cpu=False) == 1_000_000  # accelerators: TGI's
    explicit = LimitRequest(max_batch_size=4, max_total_tokens=1000, max_batch_total_tokens=64_000)
    assert _total(explicit, budget=1_000_000) == 64_000
    unset = LimitRequest(max_total_tokens=2048, max_input_tokens=2000)
    assert _total(unset, budget=10**8) == CPU_MAX_BATCH_SIZE * 2048
    odd = LimitRequest(
        max_batch_size=3, max_total_tokens=100, max_input_tokens=90, max_batch_prefill_tokens=90
    )
    assert _total(odd, budget=10**6) == 304  # 3 x 100, rounded up to whole 16-token pages
    default_prefill = LimitRequest(max_batch_size=1, max_total_tokens=100, max_input_tokens=90)
    assert _total(default_prefill, budget=10**6) == 4096  # room for one 4096-token prefill


def test_a_chunked_steps_budget_on_cpu_is_the_measured_one_unless_set():
    """With chunking, --max-batch-prefill-tokens is each step's budget (TGI's meaning): on CPU
    it defaults to CPU_CHUNK_TOKENS, below max_input_tokens; set, or on an accelerator, or
    without chunking, TGI's rules stay."""
    resolve = lambda req, on_cpu=True: resolve_limits(
        req, max_position_embeddings=8192, kv_budget=10**6, on_cpu=on_cpu
    )
    chunked = LimitRequest(max_total_tokens=4096, chunked_prefill=True)
    lim = resolve(chunked)
    assert (lim.max_batch_prefill_tokens, lim.max_input_tokens) == (CPU_CHUNK_TOKENS, 4095)
    assert resolve(chunked, on_cpu=False).max_batch_prefill_tokens == 4096
    set_ = LimitRequest(max_total_tokens=4096, max_batch_prefill_tokens=1024, chunked_prefill=True)
    assert resolve(set_).max_batch_prefill_tokens == 1024
    classic = LimitRequest(max_total_tokens=4096)
    assert resolve(classic).max_batch_prefill_tokens == 4096
    small_kv = LimitRequest(max_total_tokens=128, max_batch_total_tokens=128, chunked_prefill=True)
    assert resolve(small_kv).max_batch_prefill_tokens == min(CPU_CHUNK_TOKENS, 128)
