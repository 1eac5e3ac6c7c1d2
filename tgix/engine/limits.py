"""Effective token limits (host only): TGI's defaults and start-up checks, sized from memory.

`--max-batch-total-tokens` is the KV page budget. When unset it is sized from the memory left
after the weights: on GPU/TPU from the device's `memory_stats()` (TGI's 0.90 wiggle room of
what is free), on CPU from a quarter of the RAM this process may use (the KV cache shares it
with everything else), capped there at what the batch limits can use (max_batch_size x
max_total_tokens). The remaining limits follow TGI 3.x without chunking
(tgi-interface.md §1.3-1.4); with chunking, the prefill budget is each step's token budget,
on CPU a measured CPU_CHUNK_TOKENS by default.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tgix.engine.request import EngineLimits

CPU_RAM_FRACTION = 0.25  # of usable RAM, for KV pages when --max-batch-total-tokens is unset
DEVICE_WIGGLE_ROOM = 0.90  # TGI's TGI_WIGGLE_ROOM on free accelerator memory
CPU_MAX_BATCH_SIZE = 64  # bucket ceiling when --max-batch-size is unset (CPU)
DEVICE_MAX_BATCH_SIZE = 256
DEFAULT_PREFILL_TOKENS = 4096  # TGI's fallback when no FLOP estimate applies
# A chunked step's token budget on CPU when --max-batch-prefill-tokens is unset. XLA:CPU's
# float32 GEMMs are compute-bound from ~64 tokens (2.3 ms a token for the default model), so
# a step costs what it computes: a smaller budget costs little throughput and lets a wave of
# prompts finish one after another instead of all at the end of one long step, and keeps
# running rows' inter-token time near one budget's compute (BENCHMARKS.md, "Multi-turn chat").
CPU_CHUNK_TOKENS = 128


@dataclasses.dataclass(frozen=True, kw_only=True)
class LimitRequest:
    """What the user asked for (None: derive it)."""

    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    max_waiting_tokens: int = 20
    waiting_served_ratio: float = 0.3
    page_size: int = 16
    chunked_prefill: bool = False


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def _cgroup_limit() -> tuple[int, int] | None:
    """(memory.max, memory.current) of this process's cgroup v2, when it has a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        current = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else (int(limit), current)


def cpu_kv_bytes() -> int:
    """Bytes for KV pages on CPU: 25% of the memory this process may use (the machine's or
    its container's limit), but at most 80% of what is free now. Based on the total rather
    than on what happens to be free, so it is the same from one start to the next."""
    info = _meminfo()
    total = info.get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    free = info.get("MemAvailable", total)
    if (cgroup := _cgroup_limit()) is not None:
        limit, used = cgroup
        total, free = min(total, limit), min(free, limit - used)
    return int(min(CPU_RAM_FRACTION * total, 0.8 * free))


def kv_budget_tokens(*, free_bytes: int, kv_bytes_per_token: int, on_cpu: bool) -> int:
    """Tokens of KV that fit, rounded down to a multiple of a quarter of its highest power of
    two: free memory drifts between starts, and an unchanged KV shape lets a restart reuse
    its compiled executables."""
    fraction = 1.0 if on_cpu else DEVICE_WIGGLE_ROOM  # cpu_kv_bytes applied its own
    tokens = int(free_bytes * fraction) // kv_bytes_per_token
    if tokens < 8:
        return tokens
    step = 1 << (tokens.bit_length() - 3)
    return tokens - tokens % step


def cpu_batch_cap(req: LimitRequest, max_total: int) -> int:
    """The most KV tokens the batch limits can ever use (CPU default): every row of the
    largest batch at max_total_tokens, in whole pages. RAM beyond that would sit idle while
    other processes on the machine need it."""
    rows = req.max_batch_size or CPU_MAX_BATCH_SIZE
    return -(-rows * max_total // req.page_size) * req.page_size


def resolve_limits(
    req: LimitRequest,
    *,
    max_position_embeddings: int,
    kv_budget: int,
    on_cpu: bool,
) -> EngineLimits:
    """Fill in the unset limits and apply TGI's checks; raises ValueError with TGI's text.

    kv_budget: tokens of KV that fit the memory left (used when max_batch_total_tokens is
    unset; on CPU capped at what max_batch_size x max_total_tokens can use). max_total_tokens
    defaults to min(max_position_embeddings, 4096, KV budget).
    """
    fail = lambda msg: ValueError(f"Argument validation error: {msg}")
    page = req.page_size
    total_kv = req.max_batch_total_tokens or kv_budget
    total_kv -= total_kv % page
    max_total = req.max_total_tokens
    if max_total is None:
        cap = min(max_position_embeddings, DEFAULT_PREFILL_TOKENS, total_kv)
        max_total = cap if req.max_input_tokens is None else max(cap, req.max_input_tokens + 1)
    max_input = req.max_input_tokens if req.max_input_tokens is not None else max_total - 1
    prefill = req.max_batch_prefill_tokens
    if prefill is None and req.chunked_prefill and on_cpu:
        prefill = min(CPU_CHUNK_TOKENS, total_kv)  # a chunked step's budget, measured
    elif prefill is None:
        prefill = min(max(DEFAULT_PREFILL_TOKENS, max_input), max_position_embeddings)
        prefill = max(prefill, max_input)
    if on_cpu and req.max_batch_total_tokens is None:  # and never below one prefill step
        total_kv = min(total_kv, max(cpu_batch_cap(req, max_total), prefill))
    if req.max_batch_size == 0:
        raise fail("`max_batch_size` must be > 0")
    if max_input >= max_total:
        raise fail(f"`max_input_tokens`({max_input}) must be < `max_total_tokens`({max_total})")
    if max_input > prefill and not req.chunked_prefill:
        raise fail(
            "`max_batch_prefill_tokens` must be >= `max_input_tokens`. "
            f"Given: {prefill} and {max_input}"
        )
    if prefill > total_kv:
        raise fail(
            "`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {prefill} and {total_kv}"
        )
    if max_total > total_kv:
        if req.max_batch_total_tokens is None:
            raise fail(f"Not enough memory to handle `max_total_tokens={max_total}`")
        raise fail(
            "`max_total_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {max_total} and {total_kv}"
        )
    return EngineLimits(
        max_input_tokens=max_input,
        max_total_tokens=max_total,
        max_batch_prefill_tokens=prefill,
        max_batch_total_tokens=total_kv,
        max_batch_size=req.max_batch_size,
        max_waiting_tokens=req.max_waiting_tokens,
        waiting_served_ratio=req.waiting_served_ratio,
        page_size=page,
        chunked_prefill=req.chunked_prefill,
    )


def bucket_batch_size(limits: EngineLimits, *, on_cpu: bool) -> int:
    """The most rows a step is compiled for: --max-batch-size, else a per-platform ceiling
    (no more requests than the KV budget can hold one page each)."""
    if limits.max_batch_size is not None:
        return limits.max_batch_size
    ceiling = CPU_MAX_BATCH_SIZE if on_cpu else DEVICE_MAX_BATCH_SIZE
    return max(1, min(ceiling, limits.max_batch_total_tokens // limits.page_size))
