"""Test setup: CPU with 8 simulated devices (set before jax is imported), shared checkpoints."""

import gc
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """family -> folder of a tiny random checkpoint, written once per session on demand."""
    from tgix import testing

    cache: dict[str, object] = {}

    def get(family: str):
        if family not in cache:
            cache[family] = testing.write_tiny_checkpoint(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep converted-tokenizer caches out of the user's home during tests."""
    monkeypatch.setenv("TGIX_CACHE", str(tmp_path_factory.getbasetemp() / "tgix-cache"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test and its fixtures: JAX's jit caches cleared and a full
    garbage collection. Every XLA:CPU executable holds memory maps of its own, a process
    may hold vm.max_map_count (65,530) of them (tgix.engine.executables.StepExecutables.
    clear), and the suite runs in one process: the jit caches of tests/attention alone
    held ~36,000, engines left in reference cycles ~6,700 each."""
    result = yield
    if nextitem is None or nextitem.module is not item.module:
        if "jax" in sys.modules:
            sys.modules["jax"].clear_caches()
        gc.collect()
        _report_memory_maps(item.module.__name__)
    return result


def _report_memory_maps(module: str) -> None:
    """Fail the module's last test when it leaves over half of the memory maps in use: the
    next XLA compile past the limit would abort the whole run (a segfault in whichever test
    compiles then), with no word of the module that used them up."""
    if "jax" not in sys.modules:
        return
    from tgix.engine.executables import memory_maps

    counts = memory_maps()
    if counts and counts[0] > counts[1] // 2:
        raise AssertionError(f"{module} left {counts[0]} of {counts[1]} memory maps in use")
