"""The launcher's resolved configuration (`Settings`) and TGI's start-up checks on it.

`args.py` turns argv and environment variables into the raw values; `resolve()` here applies
TGI's derivations (legacy `--max-input-length`, `num_shard` from visible devices, `HOSTNAME`
fallback) and refuses bad combinations with TGI's messages, prefixed "Invalid argument: ".
`Capabilities` says which TGI options tgix implements today, so an accepted-but-unimplemented
value (a quantization method, speculation, tensor parallelism) fails with a clear reason
instead of being silently ignored; the engine factory can pass a wider one as features land.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger("tgix.server")

QUANTIZE_METHODS = (
    "awq",
    "compressed-tensors",
    "eetq",
    "exl2",
    "gptq",
    "marlin",
    "bitsandbytes",
    "bitsandbytes-nf4",
    "bitsandbytes-fp4",
    "fp8",
)
# what tgix implements: quantized as the weights load (tgix.models.quant) or read from a
# pre-quantized checkpoint (tgix.models.prequant, which also checks the flag against it)
LOAD_TIME_QUANTIZE = frozenset(
    {"eetq", "bitsandbytes", "fp8", "bitsandbytes-nf4", "bitsandbytes-fp4"}
)
PREQUANTIZED = frozenset({"awq", "gptq", "marlin", "compressed-tensors", "exl2"})
KV_CACHE_DTYPES = ("fp8_e4m3fn", "fp8_e5m2")
DTYPES = ("float16", "bfloat16", "float32")


class ArgumentError(ValueError):
    """A launcher argument (or combination) that tgix refuses; the message is user-facing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What this build can serve; anything outside it is refused at start-up."""

    quantize: frozenset[str] = LOAD_TIME_QUANTIZE | PREQUANTIZED
    kv_cache_dtype: frozenset[str] = frozenset(KV_CACHE_DTYPES)
    max_speculate: int = 8  # tgix.engine.speculate.MAX_SPECULATE
    max_num_shard: int | None = None  # None: the engine checks against the devices
    lora: bool = False


DEFAULT_CAPABILITIES = Capabilities()


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every TGI launcher flag (§1.1), after env-var fallback and start-up resolution.

    Token limits left as None are decided by the engine factory from the model and memory
    (the effective values come back as the engine's `EngineLimits`).
    """

    model_id: str | None = None  # None: the embedded default model
    revision: str | None = None
    validation_workers: int = 2
    sharded: bool | None = None
    num_shard: int | None = None  # None: every visible device (CPU: 1)
    quantize: str | None = None
    speculate: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    trust_remote_code: bool = False
    max_concurrent_requests: int = 128
    max_best_of: int = 2
    max_stop_sequences: int = 4
    max_top_n_tokens: int = 5
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    waiting_served_ratio: float = 0.3
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_waiting_tokens: int = 20
    max_batch_size: int | None = None
    cuda_graphs: tuple[int, ...] | None = None
    hostname: str = "127.0.0.1"
    port: int = 3000
    prometheus_port: int = 9000
    shard_uds_path: str = "/tmp/text-generation-server"
    master_addr: str = "localhost"
    master_port: int = 29500
    huggingface_hub_cache: str | None = None
    weights_cache_override: str | None = None
    disable_custom_kernels: bool = False
    cuda_memory_fraction: float = 1.0
    rope_scaling: str | None = None
    rope_factor: float | None = None
    json_output: bool = False
    otlp_endpoint: str | None = None
    otlp_service_name: str = "text-generation-inference.router"
    cors_allow_origin: tuple[str, ...] = ()
    api_key: str | None = field(default=None, repr=False)
    watermark_gamma: float | None = None
    watermark_delta: float | None = None
    ngrok: bool = False
    ngrok_authtoken: str | None = field(default=None, repr=False)
    ngrok_edge: str | None = None
    tokenizer_config_path: str | None = None
    disable_grammar_support: bool = False
    env: bool = False
    max_client_batch_size: int = 4
    lora_adapters: str | None = None
    usage_stats: str = "on"
    payload_limit: int = 2_000_000
    enable_prefill_logprobs: bool = False
    graceful_termination_timeout: int = 90
    # tgix: several processes serving one model (jax.distributed); process 0 serves HTTP
    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    data_parallel: int = 1  # tgix: model replicas in this process (each on num_shard devices)
    # tgix: images in prompts (vision-language models; server/images.py)
    max_images: int = 8
    max_image_bytes: int = 20_000_000
    image_fetch_timeout: float = 10.0
    allow_private_image_urls: bool = False


def _fail(message: str) -> ArgumentError:
    return ArgumentError(f"Invalid argument: {message}")


def _visible_devices(environ: Mapping[str, str]) -> int | None:
    """TGI's device count: CUDA_VISIBLE_DEVICES, else NVIDIA_VISIBLE_DEVICES, else
    ZE_AFFINITY_MASK (comma entries); None when none of them is set."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"):
        value = environ.get(name)
        if value is None:
            continue
        if name == "NVIDIA_VISIBLE_DEVICES" and value in ("all", "void"):
            return _nvidia_smi_count()
        return len([v for v in value.split(",") if v.strip()])
    return None


def _nvidia_smi_count() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return len(out.strip().splitlines())


def _resolve_num_shard(
    sharded: bool | None, num_shard: int | None, environ: Mapping[str, str], caps: Capabilities
) -> int | None:
    """§1.2, then the capability check: an explicit degree above what tgix serves is refused,
    an auto-detected one is capped with a log line."""
    explicit = num_shard is not None
    if sharded is True and num_shard is None:
        count = _visible_devices(environ)
        if count is None or count <= 1:
            raise ArgumentError(
                "not enough cuda devices: `sharded` is true but only found "
                f"{count or 0} CUDA devices"
            )
        num_shard = count
    elif sharded is True and num_shard is not None and num_shard <= 1:
        raise _fail("`sharded` is true but `num_shard` <= 1")
    elif sharded is False and num_shard is None:
        num_shard = 1
    elif num_shard is None:
        num_shard = _visible_devices(environ)  # None: the engine counts JAX's devices
    if num_shard is None:
        return None
    if num_shard < 1:
        raise _fail("`num_shard` cannot be < 1")
    if caps.max_num_shard is not None and num_shard > caps.max_num_shard:
        if explicit or sharded is True:
            raise _fail(
                f"`num_shard`={num_shard}: tensor-parallel serving across several devices is "
                f"not available in tgix yet (at most {caps.max_num_shard})"
            )
        log.info("found %d devices; serving on %d", num_shard, caps.max_num_shard)
        num_shard = caps.max_num_shard
    return num_shard


def _check_processes(raw: dict) -> None:
    """A group needs a coordinator and a process id inside it; replicas are per process."""
    count, pid = raw.get("num_processes") or 1, raw.get("process_id") or 0
    if count < 1:
        raise _fail("`num_processes` cannot be < 1")
    if not 0 <= pid < count:
        raise _fail(f"`process_id` must be in 0..{count - 1}, got {pid}")
    if count > 1 and not raw.get("coordinator_address"):
        raise _fail("`num_processes` > 1 needs `coordinator_address` (host:port of process 0)")
    data = raw.get("data_parallel") or 1
    if data < 1:
        raise _fail("`data_parallel` cannot be < 1")
    if data > 1 and count > 1:
        raise _fail(
            "`data_parallel` > 1 runs replicas inside one process; with several "
            "processes, run one group per replica instead"
        )


def _resolve_hostname(hostname: str | None, from_env: bool) -> str:
    """Unset: 127.0.0.1 (never exposed by accident). Like TGI, a value that is not an IP
    address (Docker and Kubernetes set HOSTNAME to the container name) falls back to 0.0.0.0
    with a warning, so containers stay reachable."""
    if hostname is None:
        return "127.0.0.1"
    if hostname == "localhost":
        return hostname
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        source = "HOSTNAME" if from_env else "--hostname"
        log.warning("%s=%r is not an IP address; binding 0.0.0.0", source, hostname)
        return "0.0.0.0"
    return hostname


def _check_unsupported(raw: dict, caps: Capabilities) -> None:
    """Refuse TGI options that tgix accepts by name but cannot honour yet, with the reason."""
    if raw["trust_remote_code"]:
        raise _fail(
            "`--trust-remote-code` is refused: tgix never imports Python code from a model "
            "repository; every architecture comes from its own registry (tgix.models)"
        )
    quantize = raw["quantize"]
    if quantize == "exl2" and (raw.get("num_shard") or 1) >= 2:
        raise _fail("Sharding is currently not supported with `exl2` quantization")
    if quantize is not None and quantize not in caps.quantize:
        raise _fail(
            f"`--quantize {quantize}` is not implemented in tgix yet (implemented: "
            f"{', '.join(f'`{m}`' for m in sorted(caps.quantize)) or 'none'})"
        )
    kv = raw["kv_cache_dtype"]
    if kv is not None and kv not in caps.kv_cache_dtype:
        raise _fail(f"`--kv-cache-dtype {kv}` is not implemented in tgix yet")
    speculate = raw["speculate"]
    if speculate is not None and not 0 <= speculate <= caps.max_speculate:
        raise _fail(
            f"`--speculate {speculate}`: draft tokens per step must be within 0 and "
            f"{caps.max_speculate}"
        )
    if raw["lora_adapters"] and not caps.lora:
        raise _fail("`--lora-adapters`: LoRA adapters are not implemented in tgix yet")
    if raw["ngrok"]:
        raise _fail("`--ngrok` is not supported (a dead feature in TGI as well)")
    if quantize and raw["dtype"] and not quantize.startswith("bitsandbytes"):
        raise ArgumentError(
            "Only 1 can be set between `dtype` and `quantize`, as they both decide how goes "
            "the final model."
        )


def _check_limits(raw: dict) -> None:
    """TGI's launcher and router checks on the flags as given (§1.4)."""
    max_input, max_total = raw["max_input_tokens"], raw["max_total_tokens"]
    if raw["validation_workers"] == 0:
        raise _fail("`validation_workers` must be > 0")
    if max_input is not None and max_total is not None and max_input >= max_total:
        raise _fail(f"`max_input_tokens`({max_input}) must be < `max_total_tokens`({max_total})")
    batch_total = raw["max_batch_total_tokens"]
    if batch_total is not None and max_total is not None and max_total > batch_total:
        raise _fail(
            "`max_total_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {max_total} and {batch_total}"
        )
    prefill = raw["max_batch_prefill_tokens"]
    if batch_total is not None and prefill is not None and prefill > batch_total:
        raise _fail(
            "`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. "
            f"Given: {prefill} and {batch_total}"
        )
    if raw["max_batch_size"] == 0:
        raise _fail("`max_batch_size` must be > 0")


def resolve(
    raw: dict,
    *,
    environ: Mapping[str, str] | None = None,
    capabilities: Capabilities = DEFAULT_CAPABILITIES,
) -> Settings:
    """Raw flag values (names = Settings fields, plus `max_input_length`) -> Settings."""
    environ = os.environ if environ is None else environ
    raw = dict(raw)
    legacy = raw.pop("max_input_length", None)
    if legacy is not None:
        if raw["max_input_tokens"] is not None:
            raise _fail(
                f"Both `max_input_tokens` ({raw['max_input_tokens']}) and `max_input_length` "
                f"({legacy}) are set. Please define only `max_input_tokens` as "
                "`max_input_length is deprecated for naming consistency."
            )
        raw["max_input_tokens"] = legacy
    _check_unsupported(raw, capabilities)
    _check_limits(raw)
    raw["num_shard"] = _resolve_num_shard(raw["sharded"], raw["num_shard"], environ, capabilities)
    raw["hostname"] = _resolve_hostname(raw["hostname"], raw.pop("_hostname_from_env", False))
    _check_processes(raw)
    if raw["rope_scaling"] is not None and raw["rope_factor"] is None:
        raw["rope_factor"] = 1.0
    elif raw["rope_factor"] is not None and raw["rope_scaling"] is None:
        raw["rope_scaling"] = "linear"
    if raw["otlp_endpoint"]:
        log.warning("--otlp-endpoint is accepted but tgix does not export traces yet")
    names = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in raw.items() if k in names})
