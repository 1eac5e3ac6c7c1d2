"""Assemble a serving Engine from a loaded model: size the KV budget, compile, warm up."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from tgix.engine.buckets import Buckets
from tgix.engine.engine import Engine, StepHook
from tgix.engine.executables import enable_compilation_cache, memory_maps
from tgix.engine.kv_cache import kv_bytes_per_token
from tgix.engine.kv_manager import KVManager
from tgix.engine.limits import (
    CPU_MAX_BATCH_SIZE,
    LimitRequest,
    bucket_batch_size,
    cpu_kv_bytes,
    kv_budget_tokens,
    resolve_limits,
)
from tgix.engine.mask_builder import ahead_from_env, budget_from_env
from tgix.engine.runner import Runner, RunnerConfig
from tgix.engine.scheduler import Scheduler, SchedulerConfig
from tgix.engine.speculate import speculate_for, speculate_rows
from tgix.models import LoadedModel
from tgix.models.vision.serving import vision_prompts

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """Everything but the token limits (LimitRequest) that shapes an engine."""

    max_top_n_tokens: int = 5
    prompt_logprobs: bool = False  # TGI's --enable-prefill-logprobs
    prefix_caching: bool = True  # TGI's PREFIX_CACHING: prompts start past cached full pages
    watermark_gamma: float = 0.5
    watermark_delta: float = 2.0
    kv_dtype: str | None = None  # None: the model's dtype
    # where compiled steps are kept (CPU: tgix's serialized executables; GPU/TPU: JAX's
    # persistent compilation cache); None: $TGIX_CACHE/xla, "": off
    compilation_cache: str | None = None
    compile: bool = True  # compile every bucket before serving
    warmup: bool = True  # run one request end to end before reporting healthy
    prewarm: bool = False  # then, while idle, run every cheap step shape once (prewarm.py)
    progress: bool = True
    stall_timeout_s: float = 120.0
    memory_fraction: float = 1.0  # TGI's --cuda-memory-fraction: share of accelerator memory
    grammar_workers: int = 1  # grammar compile processes; 0: in the caller's thread; -1: none
    # objects without additionalProperties are closed (TGI, OpenAI); False: JSON Schema's open
    grammar_strict: bool = True
    host_memory_share: float = 1.0  # CPU: the part of the KV budget this engine takes
    # TGI's --speculate: draft tokens per decode row (speculate.py); None: a Medusa model's
    # head count, else 0
    speculate: int | None = None
    verify_tokens: int | None = None  # most tokens of a verify step (None: measured default)


def _kv_source(req: LimitRequest, effective, budget: int) -> str:
    """Why the KV cache has the size it has, for the start-up line."""
    if req.max_batch_total_tokens is not None:
        return "from --max-batch-total-tokens"
    if effective.max_batch_total_tokens < budget - effective.page_size:
        rows = req.max_batch_size or CPU_MAX_BATCH_SIZE
        return f"what the batch limits can use ({rows} rows x {effective.max_total_tokens} tokens)"
    return f"the memory left ({budget} tokens fit)"


def free_device_bytes(mesh, fraction: float = 1.0) -> int:
    """Memory left on the fullest device of the mesh within `fraction` of its capacity
    (accelerators only)."""
    free = []
    for device in mesh.devices.flat:
        stats = device.memory_stats() or {}
        free.append(fraction * stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0))
    return int(max(0, min(free)))


def create_engine(
    loaded: LoadedModel,
    tokenizer,
    limits: LimitRequest | None = None,
    options: EngineOptions | None = None,
    *,
    model_id: str = "",
    on_step: StepHook | None = None,
    channel=None,
) -> Engine:
    """Size the limits, compile, warm up. `channel` (process 0 of a multi-process group,
    tgix.sharding.distributed.Channel): the runner config and every step go to the other
    processes (tgix.engine.follower), which run them on their devices."""
    limits = limits or LimitRequest()
    options = options or EngineOptions()
    cfg = loaded.config
    on_cpu = jax.default_backend() == "cpu"
    kv_dtype = jnp.dtype(options.kv_dtype) if options.kv_dtype else _param_dtype(loaded)
    model_shards = loaded.mesh.shape.get("model", 1)
    per_token = kv_bytes_per_token(cfg, kv_dtype) // model_shards
    free = (
        int(cpu_kv_bytes() * options.host_memory_share)
        if on_cpu
        else free_device_bytes(loaded.mesh, options.memory_fraction)
    )
    budget = kv_budget_tokens(free_bytes=free, kv_bytes_per_token=per_token, on_cpu=on_cpu)
    effective = resolve_limits(
        limits,
        max_position_embeddings=cfg.max_position,
        kv_budget=budget,
        on_cpu=on_cpu,
    )
    logger.info(
        "weights: %.1f MiB (%s); KV cache: %d tokens (%.1f MiB, %s), %s",
        loaded.weight_bytes / 2**20,
        ", ".join(
            [f"--quantize {loaded.quantize}" if loaded.quantize else _param_dtype(loaded).name]
            + ([f"{loaded.quantize_form} form"] if loaded.quantize_form else [])
        ),
        effective.max_batch_total_tokens,
        effective.max_batch_total_tokens * per_token / 2**20,
        kv_dtype.name,
        _kv_source(limits, effective, budget),
    )
    max_rows = bucket_batch_size(effective, on_cpu=on_cpu)
    speculate = speculate_for(options.speculate, loaded.draft_heads)
    draft_rows = speculate_rows(
        speculate, max_rows, on_cpu=on_cpu, verify_tokens=options.verify_tokens
    )
    page_size = effective.page_size
    buckets = Buckets.build(
        max_batch_prefill_tokens=effective.max_batch_prefill_tokens,
        max_batch_size=max_rows,
        max_total_tokens=effective.max_total_tokens,
        page_size=page_size,
        chunked_prefill=effective.chunked_prefill,
        prefix_caching=options.prefix_caching,
        prompt_logprobs=options.prompt_logprobs,
        speculate=speculate,
        speculate_rows=draft_rows,
        images=loaded.vision is not None,
    )
    executable_cache = None
    if options.compilation_cache != "":
        from tgix.tokenizer import cache_root

        root = Path(options.compilation_cache or cache_root() / "xla")
        if on_cpu and channel is None:  # serialized executables (see executable_cache.py
            executable_cache = str(root / "tgix-executables")  # for why not both)
        elif not on_cpu:  # (a CPU group compiles at each start)
            enable_compilation_cache(root)
    num_pages = effective.max_batch_total_tokens // page_size + 1  # + the null page
    runner = Runner(
        loaded,
        RunnerConfig(
            num_pages=num_pages,
            page_size=page_size,
            buckets=buckets,
            num_top=options.max_top_n_tokens,
            vocab_limit=min(tokenizer.vocab_size, cfg.vocab_size),
            kv_dtype=kv_dtype,
            watermark_gamma=options.watermark_gamma,
            watermark_delta=options.watermark_delta,
            executable_cache=executable_cache,
            draft_head_rows=draft_rows if loaded.draft_heads else 0,
        ),
    )
    if channel is not None:
        channel.publish(("config", runner.config))
        runner.broadcast = channel.publish
    if options.compile:
        start = time.perf_counter()
        runner.executables.compile_all(progress=options.progress)
        logger.info(
            "compiled %d executables in %.1fs", len(runner.executables), time.perf_counter() - start
        )
        _check_memory_maps()
    scheduler = Scheduler(
        SchedulerConfig(
            max_batch_prefill_tokens=effective.max_batch_prefill_tokens,
            max_batch_total_tokens=effective.max_batch_total_tokens,
            max_batch_size=max_rows,
            max_waiting_tokens=effective.max_waiting_tokens,
            waiting_served_ratio=effective.waiting_served_ratio,
            chunked_prefill=effective.chunked_prefill,
            speculate=speculate,
            speculate_rows=draft_rows,
        ),
        KVManager(num_pages, page_size, prefix_caching=options.prefix_caching),
    )
    engine = Engine(
        runner,
        scheduler,
        tokenizer,
        effective,
        model_id=model_id,
        prompt_logprobs=options.prompt_logprobs,
        stall_timeout_s=options.stall_timeout_s,
        on_step=on_step,
        prewarm=options.prewarm,
        mask_wait_s=budget_from_env(),
        mask_ahead=ahead_from_env(accelerator=jax.default_backend() != "cpu"),
    )
    engine.grammar_compiler = _grammar_compiler(tokenizer, cfg.vocab_size, options)
    engine.vision = vision_prompts(loaded, tokenizer, compile=options.compile)
    engine.quantize = loaded.quantize  # /info: the effective method (a checkpoint's included)
    engine.kv_dtype = kv_dtype.name  # /info
    engine.warmup(run_request=options.warmup)
    return engine


def create_replicas(
    loaded: LoadedModel,
    tokenizer,
    limits: LimitRequest | None,
    options: EngineOptions,
    *,
    data: int,
    model_id: str = "",
    on_step: StepHook | None = None,
):
    """`data` engines, one per (1, model) slice of the visible devices, behind one Replicas
    facade (replica 0 holds `loaded`; the others get copies of its weights). One grammar
    compiler serves them all; on CPU they split the host's KV budget."""
    from tgix.engine.replicas import Replicas
    from tgix.models import place
    from tgix.sharding import replica_meshes

    meshes = replica_meshes(loaded.mesh.shape["model"], data)  # ShardingError (a ValueError)
    share = dataclasses.replace(options, host_memory_share=options.host_memory_share / data)
    engines = []
    for r, mesh in enumerate(meshes):
        replica = loaded if r == 0 else place(loaded, mesh)
        replica_options = share if r == 0 else dataclasses.replace(share, grammar_workers=-1)
        engines.append(
            create_engine(
                replica, tokenizer, limits, replica_options, model_id=model_id, on_step=on_step
            )
        )
    return Replicas(engines)


def _grammar_compiler(tokenizer, logit_width: int, options: EngineOptions):
    """The engine's grammar compiler, its workers starting in the background; None when
    disabled or when this tokenizer's alphabet cannot be read."""
    if options.grammar_workers < 0:
        return None
    from tgix.grammar import GrammarCompiler, GrammarOptions
    from tgix.tokenizer import cache_root

    try:
        compiler = GrammarCompiler.for_tokenizer(
            tokenizer,
            size=logit_width,
            options=GrammarOptions(strict=options.grammar_strict),
            workers=options.grammar_workers,
            lazy=os.environ.get("TGIX_GRAMMAR_LAZY", "1") != "0",
            cache_dir=cache_root() / "grammars" if options.compilation_cache != "" else None,
        )
    except Exception:  # grammars off, everything else still serves
        logger.exception("grammar support disabled: cannot read the tokenizer's vocabulary")
        return None
    if options.grammar_workers > 0:
        threading.Thread(target=compiler.warm_up, name="tgix-grammar-warmup", daemon=True).start()
    return compiler


def _param_dtype(loaded: LoadedModel):
    """The model dtype: its embedding's (linear layers may hold quantized codes)."""
    return loaded.model.embed_tokens.embedding[...].dtype


def _check_memory_maps() -> None:
    """Warn when the compiled steps hold over half of the process's memory-map limit: a
    compile past it crashes the process (StepExecutables.clear)."""
    counts = memory_maps()
    if counts and counts[0] > counts[1] // 2:
        logger.warning(
            "this process holds %d of its %d memory maps (vm.max_map_count), most of them "
            "compiled kernels; more step shapes could exhaust them and crash a compile: "
            "raise the limit (sysctl -w vm.max_map_count=262144) or compile fewer shapes",
            *counts,
        )
