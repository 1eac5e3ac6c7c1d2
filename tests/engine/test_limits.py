"""Start-up sizing of the KV cache on CPU: the default budget takes at most what the batch
limits can use (max_batch_size x max_total_tokens), so a small server on a shared machine
leaves the rest of RAM alone; an explicit --max-batch-total-tokens and accelerators keep
TGI's "largest that fits"."""

from __future__ import annotations

from tgix.engine.limits import CPU_MAX_BATCH_SIZE, LimitRequest, resolve_limits


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
