"""TGI's launcher command line: every flag of §1.1 with its env var and default.

Each flag reads its env var (SCREAMING_SNAKE of the field name) when absent from argv, as
clap's `env` does; boolean switches take no value and read their env var with clap's falsey
parser. `parse_args(argv)` returns the resolved `Settings` or raises `ArgumentError` with
TGI's message ("Invalid argument: ..."); argparse itself exits 2 on a malformed value.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from server.settings import (
    DEFAULT_CAPABILITIES,
    DTYPES,
    KV_CACHE_DTYPES,
    QUANTIZE_METHODS,
    Capabilities,
    Settings,
    resolve,
)

FALSEY = ("0", "false", "no", "off", "n", "f", "")


def _falsey(value: str) -> bool:
    return value.strip().lower() not in FALSEY


def _true_false(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
    return value.lower() == "true"


def _int_list(value: str) -> tuple[int, ...]:
    """`--cuda-graphs 1,2,4`: zero entries are dropped, so `0` disables."""
    return tuple(n for n in (int(v) for v in value.split(",") if v.strip()) if n != 0)


def _str_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True, slots=True)
class Flag:
    name: str  # Settings field (or max_input_length)
    kind: Callable[[str], Any] | str  # a converter, or "switch" / "append"
    help: str
    choices: Sequence[str] | None = None
    short: str | None = None


FLAGS: tuple[Flag, ...] = (
    Flag("model_id", str, "folder, .gguf file or Hub id (default: embedded SmolLM2)"),
    Flag("revision", str, "Hub commit or branch, e.g. refs/pr/2"),
    Flag("validation_workers", int, "tokenizer threads for request validation (2)"),
    Flag("sharded", _true_false, "true|false: shard the model across devices"),
    Flag("num_shard", int, "tensor-parallel degree (default: every visible GPU/TPU; CPU 1)"),
    Flag("quantize", str, "weight quantization method", QUANTIZE_METHODS),
    Flag("speculate", int, "speculative tokens per step"),
    Flag("dtype", str, "parameter dtype", DTYPES),
    Flag("kv_cache_dtype", str, "KV cache dtype (default: the model dtype)", KV_CACHE_DTYPES),
    Flag("trust_remote_code", "switch", "refused: tgix never runs code from model repos"),
    Flag("max_concurrent_requests", int, "queued + running requests before 429 (128)"),
    Flag("max_best_of", int, "upper bound for best_of (2)"),
    Flag("max_stop_sequences", int, "upper bound for len(stop) (4)"),
    Flag("max_top_n_tokens", int, "upper bound for top_n_tokens / top_logprobs (5)"),
    Flag("max_input_tokens", int, "max prompt tokens (default: from the model and memory)"),
    Flag("max_input_length", int, "legacy alias of --max-input-tokens"),
    Flag("max_total_tokens", int, "max prompt + generated tokens per request"),
    Flag("waiting_served_ratio", float, "waiting/running ratio that forces a prefill (0.3)"),
    Flag("max_batch_prefill_tokens", int, "token budget of one prefill step"),
    Flag("max_batch_total_tokens", int, "KV cache budget in tokens (default: from memory)"),
    Flag("max_waiting_tokens", int, "decode steps before waiting requests are forced in (20)"),
    Flag("max_batch_size", int, "hard cap on requests per batch"),
    Flag("cuda_graphs", _int_list, "accepted for compatibility; tgix compiles buckets"),
    Flag("hostname", str, "bind address (default 127.0.0.1; non-IP values: 0.0.0.0)"),
    Flag("port", int, "HTTP port (3000)", short="-p"),
    Flag("prometheus_port", int, "accepted; metrics are served on GET /metrics"),
    Flag("shard_uds_path", str, "accepted for compatibility (no shard processes)"),
    Flag("master_addr", str, "accepted for compatibility"),
    Flag("master_port", int, "accepted for compatibility"),
    Flag("huggingface_hub_cache", str, "Hub download cache"),
    Flag("weights_cache_override", str, "alternate weights location"),
    Flag("disable_custom_kernels", "switch", "use reference kernels only"),
    Flag("cuda_memory_fraction", float, "fraction of device memory to use (1.0)"),
    Flag("rope_scaling", str, "linear|dynamic", ("linear", "dynamic")),
    Flag("rope_factor", float, "RoPE scaling factor"),
    Flag("json_output", "switch", "JSON log lines"),
    Flag("otlp_endpoint", str, "OpenTelemetry collector (accepted; not exported yet)"),
    Flag("otlp_service_name", str, "OpenTelemetry service name"),
    Flag("cors_allow_origin", "append", "allowed CORS origin (repeatable); none: no CORS"),
    Flag("api_key", str, "require Authorization: Bearer <key> on every route but health"),
    Flag("watermark_gamma", float, "watermark green-list fraction (0.5)"),
    Flag("watermark_delta", float, "watermark logit bias (2.0)"),
    Flag("ngrok", "switch", "refused (dead in TGI)"),
    Flag("ngrok_authtoken", str, "unused"),
    Flag("ngrok_edge", str, "unused"),
    Flag("tokenizer_config_path", str, "tokenizer_config.json overriding the chat template"),
    Flag("disable_grammar_support", "switch", "reject grammar / response_format / tools"),
    Flag("env", "switch", "log the runtime environment at start", short="-e"),
    Flag("max_client_batch_size", int, "max prompts in one /v1/completions request (4)"),
    Flag("lora_adapters", str, "LoRA adapters (not implemented yet)"),
    Flag("usage_stats", str, "accepted; tgix never sends telemetry", ("on", "off", "no-stack")),
    Flag("payload_limit", int, "max request body bytes (2000000)"),
    Flag("enable_prefill_logprobs", "switch", "allow decoder_input_details prompt logprobs"),
    Flag("graceful_termination_timeout", int, "seconds to drain on SIGTERM (90)", short="-g"),
    Flag("data_parallel", int, "model replicas in this process, each on --num-shard devices"),
    Flag("coordinator_address", str, "host:port of process 0 when several processes serve"),
    Flag("num_processes", int, "processes serving one model (1); process 0 serves HTTP"),
    Flag("process_id", int, "this process's index in 0..num_processes-1 (0)"),
    Flag("max_images", int, "most images in one prompt (8; vision-language models)"),
    Flag("max_image_bytes", int, "largest image a URL may return, in bytes (20000000)"),
    Flag("image_fetch_timeout", float, "seconds to fetch an image URL (10)"),
    Flag("allow_private_image_urls", "switch", "fetch images from private/loopback addresses"),
)


# None means "derive it" for these, not "use the Settings default".
_NONE_IS_MEANINGFUL = frozenset({"num_shard", "hostname"})


def _env_name(flag: Flag) -> str | None:
    return None if flag.name == "env" else flag.name.upper()


def _convert_env(flag: Flag, value: str) -> Any:
    if flag.kind == "switch":
        return _falsey(value)
    if flag.kind == "append":
        return list(_str_list(value))
    converted = flag.kind(value)  # type: ignore[operator]  # a converter here
    if flag.choices is not None and converted not in flag.choices:
        raise argparse.ArgumentTypeError(
            f"{flag.name.upper()}={value!r}: expected one of {', '.join(flag.choices)}"
        )
    return converted


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """argparse over FLAGS, with defaults taken from the environment."""
    parser = argparse.ArgumentParser(
        prog="python -m tgix.serve", description="TGI-compatible LLM server on JAX."
    )
    for flag in FLAGS:
        names = ["--" + flag.name.replace("_", "-")] + ([flag.short] if flag.short else [])
        env = _env_name(flag)
        default = None
        if env is not None and env in environ and flag.name != "hostname":
            try:
                default = _convert_env(flag, environ[env])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"invalid value in environment variable {env}: {exc}")
        help_text = f"{flag.help} [env {env}]" if env else flag.help
        if flag.kind == "switch":
            parser.add_argument(*names, dest=flag.name, action="store_true", help=help_text)
            parser.set_defaults(**{flag.name: bool(default)})
        elif flag.kind == "append":
            parser.add_argument(*names, dest=flag.name, action="append", help=help_text)
            parser.set_defaults(**{flag.name: default})
        else:
            parser.add_argument(
                *names,
                dest=flag.name,
                type=flag.kind,
                choices=flag.choices,
                default=default,
                help=help_text,
            )
    return parser


def parse_args(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    capabilities: Capabilities = DEFAULT_CAPABILITIES,
) -> Settings:
    """argv + environment -> resolved Settings (raises ArgumentError with TGI's message)."""
    environ = os.environ if environ is None else environ
    raw = vars(build_parser(environ).parse_args(argv))
    # HOSTNAME is read here, not as a parser default, to know where the value came from.
    raw["_hostname_from_env"] = raw["hostname"] is None and "HOSTNAME" in environ
    if raw["_hostname_from_env"]:
        raw["hostname"] = environ["HOSTNAME"]
    raw["cors_allow_origin"] = tuple(raw["cors_allow_origin"] or ())
    defaults = Settings()
    for flag in FLAGS:
        if raw[flag.name] is None and flag.name not in _NONE_IS_MEANINGFUL:
            raw[flag.name] = getattr(defaults, flag.name, None)
    return resolve(raw, environ=environ, capabilities=capabilities)
