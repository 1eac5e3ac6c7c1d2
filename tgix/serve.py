"""`python -m tgix.serve`: TGI's launcher. Parses TGI's flags (server.args), loads the model and
tokenizer, sizes the limits and compiles every step shape (tgix.engine.factory), then serves
the HTTP API (server.app) until SIGTERM.
"""

from __future__ import annotations

import os
import sys

from tgix.models.hub import DEFAULT_MODEL_ID as DEFAULT_MODEL_NAME


def env_flag(name: str, *, default: bool) -> bool:
    """TGI's boolean environment variables: `1`/`true` on, `0`/`false` off (any case)."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() not in ("0", "false")


def limit_request(settings):
    """The launcher's token-limit flags as the engine's LimitRequest (None: derive)."""
    from tgix.engine.limits import LimitRequest

    return LimitRequest(
        max_input_tokens=settings.max_input_tokens,
        max_total_tokens=settings.max_total_tokens,
        max_batch_prefill_tokens=settings.max_batch_prefill_tokens,
        max_batch_total_tokens=settings.max_batch_total_tokens,
        max_batch_size=settings.max_batch_size,
        max_waiting_tokens=settings.max_waiting_tokens,
        waiting_served_ratio=settings.waiting_served_ratio,
        # off by default here (TGI 3 chunks by default): with the CPU's 128-token steps it
        # answers cached chat turns sooner but serves 6-18% fewer tokens/s on the peers load
        # (BENCHMARKS.md, "Multi-turn chat", fourth run)
        chunked_prefill=env_flag("PREFILL_CHUNKING", default=False),
    )


def process_group(settings):
    """This process's place in a multi-process group, or None for a single process."""
    from tgix.sharding.distributed import ProcessGroup

    if settings.num_processes <= 1:
        return None
    return ProcessGroup(settings.coordinator_address, settings.num_processes, settings.process_id)


def shard_count(settings, group) -> int | None:
    """TGI's default shards over every visible GPU/TPU; a single CPU process (where extra
    devices are only simulated) defaults to one. None: the widest the heads allow."""
    import jax

    if settings.num_shard is not None:
        return settings.num_shard
    return None if group is not None or jax.default_backend() != "cpu" else 1


KV_DTYPES = {"fp8_e4m3fn": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}  # --kv-cache-dtype


def build_engine(settings):
    """The launcher's engine factory: Settings -> a warmed-up Engine. In a multi-process
    group, processes other than 0 replay process 0's steps here and return None when it
    stops (they serve no HTTP)."""
    from server.metrics import record_step
    from server.settings import ArgumentError
    from tgix.engine.factory import EngineOptions, create_engine, create_replicas
    from tgix.models import QuantizeError, load_model
    from tgix.sharding import ShardingError
    from tgix.tokenizer import load_tokenizer

    if settings.rope_scaling is not None or settings.rope_factor is not None:
        raise ArgumentError(
            "Invalid argument: `--rope-scaling`/`--rope-factor` are not supported yet; "
            "tgix applies the rope_scaling of the model's config.json"
        )
    group = process_group(settings)
    channel = None
    if group is not None:
        from tgix.sharding.distributed import Channel, initialize

        initialize(group, heartbeat_timeout_s=int(os.environ.get("TGIX_HEARTBEAT_TIMEOUT", "10")))
        channel = Channel()
    try:
        loaded = load_model(
            settings.model_id,
            revision=settings.revision,
            dtype=settings.dtype,
            cache_dir=settings.huggingface_hub_cache,
            token=os.environ.get("HF_TOKEN"),
            num_shard=shard_count(settings, group),
            data=settings.data_parallel,
            quantize=settings.quantize,
        )
    except (ShardingError, QuantizeError) as exc:
        raise ArgumentError(f"Invalid argument: {exc}") from exc
    if group is not None and not group.is_leader:
        from tgix.engine.follower import follow

        follow(loaded, channel)
        return None
    tokenizer = load_tokenizer(loaded.files, tokenizer_config_path=settings.tokenizer_config_path)
    limits = limit_request(settings)
    options = EngineOptions(
        max_top_n_tokens=settings.max_top_n_tokens,
        prompt_logprobs=settings.enable_prefill_logprobs,
        prefix_caching=env_flag("PREFIX_CACHING", default=True),
        watermark_gamma=settings.watermark_gamma if settings.watermark_gamma is not None else 0.5,
        watermark_delta=settings.watermark_delta if settings.watermark_delta is not None else 2.0,
        progress=sys.stderr.isatty() or os.environ.get("TGIX_PROGRESS") == "1",
        memory_fraction=settings.cuda_memory_fraction,
        grammar_workers=-1 if settings.disable_grammar_support else 1,
        grammar_strict=os.environ.get("TGIX_GRAMMAR_STRICT", "1") != "0",
        prewarm=True,
        speculate=settings.speculate,
        verify_tokens=int(os.environ.get("TGIX_VERIFY_TOKENS", "0")) or None,
        kv_dtype=KV_DTYPES.get(settings.kv_cache_dtype),
    )
    model_id = settings.model_id or DEFAULT_MODEL_NAME
    try:
        if settings.data_parallel > 1:
            return create_replicas(
                loaded,
                tokenizer,
                limits,
                options,
                data=settings.data_parallel,
                model_id=model_id,
                on_step=record_step,
            )
        return create_engine(
            loaded,
            tokenizer,
            limits,
            options,
            model_id=model_id,
            on_step=record_step,
            channel=channel,
        )
    except ValueError as exc:  # TGI's start-up checks on the effective limits
        raise ArgumentError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    from server.main import main as serve_main

    return serve_main(sys.argv[1:] if argv is None else argv, build_engine)


if __name__ == "__main__":
    sys.exit(main())
