"""Launcher flags (§1.1): env-var fallback, defaults, TGI's start-up checks and messages
(§1.4), unimplemented options refused with a reason, and main()'s exit statuses."""

from __future__ import annotations

import dataclasses

import pytest

from server import main as main_module
from server.args import FLAGS, parse_args
from server.settings import ArgumentError, Capabilities, Settings
from tests.server.fake_engine import FakeEngine


def parse(*argv: str, **env: str) -> Settings:
    return parse_args(list(argv), environ=env)


def test_every_setting_has_a_flag_and_tgis_defaults():
    names = {f.name for f in FLAGS} - {"max_input_length"}
    assert names == {f.name for f in dataclasses.fields(Settings)}
    s = parse()
    assert (s.validation_workers, s.max_concurrent_requests, s.max_best_of) == (2, 128, 2)
    assert (s.max_stop_sequences, s.max_top_n_tokens, s.max_client_batch_size) == (4, 5, 4)
    assert (s.waiting_served_ratio, s.max_waiting_tokens, s.port) == (0.3, 20, 3000)
    assert (s.payload_limit, s.graceful_termination_timeout, s.num_shard) == (2_000_000, 90, None)
    assert (s.coordinator_address, s.num_processes, s.process_id) == (None, 1, 0)
    assert s.hostname == "127.0.0.1" and s.cors_allow_origin == () and s.api_key is None


def test_env_vars_and_flags():
    s = parse(
        "--max-total-tokens",
        "2048",
        "-p",
        "8080",
        "--cors-allow-origin",
        "a",
        "--cors-allow-origin",
        "b",
        MAX_INPUT_TOKENS="1000",
        JSON_OUTPUT="true",
        DISABLE_GRAMMAR_SUPPORT="off",
        API_KEY="k",
        MAX_CONCURRENT_REQUESTS="7",
        GRACEFUL_TERMINATION_TIMEOUT="3",
    )
    assert (s.max_input_tokens, s.max_total_tokens, s.port) == (1000, 2048, 8080)
    assert s.json_output is True and s.disable_grammar_support is False and s.api_key == "k"
    assert (s.max_concurrent_requests, s.graceful_termination_timeout) == (7, 3)
    assert s.cors_allow_origin == ("a", "b")
    assert parse(CORS_ALLOW_ORIGIN="x,y").cors_allow_origin == ("x", "y")
    assert parse("--max-input-tokens", "5", MAX_INPUT_TOKENS="9").max_input_tokens == 5  # argv wins
    assert parse(CUDA_GRAPHS="0").cuda_graphs == () and parse(
        "--cuda-graphs", "1,0,4"
    ).cuda_graphs == (1, 4)
    assert parse("-g", "7", "-e").graceful_termination_timeout == 7


def test_legacy_input_length_and_hostname():
    assert parse("--max-input-length", "10").max_input_tokens == 10
    assert parse(HOSTNAME="abc123").hostname == "0.0.0.0"  # a container name: TGI's fallback
    assert parse(HOSTNAME="10.1.2.3").hostname == "10.1.2.3"
    assert parse("--hostname", "::1").hostname == "::1"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--max-input-tokens", "5", "--max-input-length", "6"],
            {},
            "Invalid argument: Both `max_input_tokens` (5) and `max_input_length` (6) are set. "
            "Please define only `max_input_tokens` as `max_input_length is deprecated for naming "
            "consistency.",
        ),
        (
            ["--max-input-tokens", "5", "--max-total-tokens", "5"],
            {},
            "Invalid argument: `max_input_tokens`(5) must be < `max_total_tokens`(5)",
        ),
        (["--validation-workers", "0"], {}, "Invalid argument: `validation_workers` must be > 0"),
        (
            ["--max-total-tokens", "9", "--max-batch-total-tokens", "8"],
            {},
            "Invalid argument: `max_total_tokens` must be <= `max_batch_total_tokens`. "
            "Given: 9 and 8",
        ),
        (["--max-batch-size", "0"], {}, "Invalid argument: `max_batch_size` must be > 0"),
        (
            ["--sharded", "true", "--num-shard", "1"],
            {},
            "Invalid argument: `sharded` is true but `num_shard` <= 1",
        ),
        (["--num-shard", "0"], {}, "Invalid argument: `num_shard` cannot be < 1"),
        (
            ["--sharded", "true"],
            {"CUDA_VISIBLE_DEVICES": "0"},
            "not enough cuda devices: `sharded` is true but only found 1 CUDA devices",
        ),
        (
            ["--num-processes", "2"],
            {},
            "Invalid argument: `num_processes` > 1 needs `coordinator_address` (host:port of "
            "process 0)",
        ),
        (
            ["--process-id", "2"],
            {"NUM_PROCESSES": "2", "COORDINATOR_ADDRESS": "10.0.0.1:1234"},
            "Invalid argument: `process_id` must be in 0..1, got 2",
        ),
        (
            ["--trust-remote-code"],
            {},
            "Invalid argument: `--trust-remote-code` is refused: tgix never "
            "imports Python code from a model repository; every architecture comes from its own "
            "registry (tgix.models)",
        ),
        ([], {"TRUST_REMOTE_CODE": "1"}, "Invalid argument: `--trust-remote-code` is refused"),
        (
            ["--quantize", "exl2", "--num-shard", "2"],
            {},
            "Invalid argument: Sharding is currently not supported with `exl2` quantization",
        ),
        (
            ["--speculate", "9"],
            {},
            "Invalid argument: `--speculate 9`: draft tokens per step must be within 0 and 8",
        ),
        (
            ["--lora-adapters", "a/b"],
            {},
            "Invalid argument: `--lora-adapters`: LoRA adapters are not implemented in tgix yet",
        ),
    ],
)
def test_startup_errors(argv, env, message):
    with pytest.raises(ArgumentError) as info:
        parse_args(argv, environ=env)
    assert str(info.value).startswith(message)


def test_capabilities_hook_and_device_derivation():
    assert parse_args(["--quantize", "eetq"], environ={}).quantize == "eetq"
    assert parse_args([], environ={"QUANTIZE": "bitsandbytes"}).quantize == "bitsandbytes"
    caps = Capabilities(quantize=frozenset({"fp8"}), max_num_shard=4)
    s = parse_args(["--quantize", "fp8", "--num-shard", "4"], environ={}, capabilities=caps)
    assert (s.quantize, s.num_shard) == ("fp8", 4)
    with pytest.raises(ArgumentError, match="Only 1 can be set between `dtype` and `quantize`"):
        parse_args(["--quantize", "fp8", "--dtype", "float16"], environ={}, capabilities=caps)
    assert parse_args([], environ={"CUDA_VISIBLE_DEVICES": "0,1"}, capabilities=caps).num_shard == 2
    one = Capabilities(max_num_shard=1)
    detected = parse_args([], environ={"CUDA_VISIBLE_DEVICES": "0,1,2"}, capabilities=one)
    assert detected.num_shard == 1  # detected, capped: no error
    assert parse(CUDA_VISIBLE_DEVICES="0,1,2").num_shard == 3
    assert parse("--num-shard", "2").num_shard == 2  # the engine checks it against the devices
    group = parse("--num-processes", "2", "--process-id", "1", COORDINATOR_ADDRESS="h:9")
    assert (group.coordinator_address, group.num_processes, group.process_id) == ("h:9", 2, 1)
    assert parse("--sharded", "false", CUDA_VISIBLE_DEVICES="0,1").num_shard == 1


def test_malformed_values_exit_2(capsys):
    for argv, env in ((["--port", "x"], {}), (["--quantize", "nope"], {}), ([], {"PORT": "x"})):
        with pytest.raises(SystemExit) as info:
            parse_args(argv, environ=env)
        assert info.value.code == 2


def test_main_exit_statuses(monkeypatch, capsys):
    monkeypatch.setattr(main_module, "setup_logging", lambda json_output: None)
    assert main_module.main(["--trust-remote-code"], FakeEngine) == 1
    assert "Invalid argument: `--trust-remote-code` is refused" in capsys.readouterr().err
    assert main_module.main(["--port", "nope"], FakeEngine) == 2

    from tgix.engine.request import EngineLimits

    bad = FakeEngine(
        EngineLimits(
            max_input_tokens=100,
            max_total_tokens=200,
            max_batch_prefill_tokens=50,
            max_batch_total_tokens=1000,
            max_batch_size=None,
            max_waiting_tokens=20,
            waiting_served_ratio=0.3,
            page_size=16,
            chunked_prefill=False,
        )
    )
    assert main_module.main([], lambda settings: bad) == 1
    assert bad.shutdown_calls == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "Argument validation error: `max_batch_prefill_tokens` must be >= `max_input_tokens`. "
            "Given: 50 and 100"
        )
    )

    served = []
    monkeypatch.setattr(main_module, "serve", lambda app, settings: served.append((app, settings)))
    seen = []
    assert main_module.main(["--port", "4000"], lambda s: seen.append(s) or FakeEngine()) == 0
    assert seen[0].port == 4000 and served[0][1].port == 4000
    assert capsys.readouterr().out == (
        "tgix serving fake/echo on http://127.0.0.1:4000: max_input_tokens=200 "
        "max_total_tokens=256 max_batch_prefill_tokens=512 max_batch_total_tokens=4096 "
        "max_batch_size=auto page_size=16 chunked_prefill=on max_concurrent_requests=128\n"
    )


def test_prefill_chunking_is_off_unless_turned_on(monkeypatch):
    """PREFILL_CHUNKING (TGI's variable) defaults off here (measured: BENCHMARKS.md); `1` /
    `true` chunk. The step budget stays unset: the engine sizes it for the platform."""
    from tgix.serve import limit_request

    settings = parse_args([], environ={})
    monkeypatch.delenv("PREFILL_CHUNKING", raising=False)
    classic = limit_request(settings)
    assert not classic.chunked_prefill and classic.max_batch_prefill_tokens is None
    for on in ("1", "true", "TRUE"):
        monkeypatch.setenv("PREFILL_CHUNKING", on)
        assert limit_request(settings).chunked_prefill
    monkeypatch.setenv("PREFILL_CHUNKING", "0")
    assert not limit_request(settings).chunked_prefill
