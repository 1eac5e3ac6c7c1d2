"""Serialized executables: a second start loads instead of compiling, a damaged file is
recompiled, and each description gets its own entry; a shut-down engine gives its
executables' memory maps back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tgix.engine.executable_cache import ExecutableCache


def _compile(scale):
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    return lambda: jax.jit(lambda x: x * scale + 1).lower(spec).compile()


def test_load_after_save_runs_the_same_program(tmp_path):
    devices = jax.devices()[:1]
    x = jnp.arange(4, dtype=jnp.float32)
    first = ExecutableCache(tmp_path, devices)
    want = np.asarray(first.get_or_compile("double", _compile(2.0))(x))
    second = ExecutableCache(tmp_path, devices)
    got = np.asarray(second.get_or_compile("double", _compile(99.0))(x))  # must not compile
    assert (first.misses, second.hits, second.misses) == (1, 1, 0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [1, 3, 5, 7])


def test_damaged_entry_is_recompiled_and_descriptions_are_separate(tmp_path):
    devices = jax.devices()[:1]
    x = jnp.ones(4, jnp.float32)
    cache = ExecutableCache(tmp_path, devices)
    cache.get_or_compile("a", _compile(2.0))
    cache.get_or_compile("b", _compile(3.0))
    files = sorted(tmp_path.glob("*.exe"))
    assert len(files) == 2
    for f in files:
        f.write_bytes(b"garbage")
    again = ExecutableCache(tmp_path, devices)
    np.testing.assert_array_equal(np.asarray(again.get_or_compile("b", _compile(3.0))(x)), 4.0)
    assert (again.hits, again.misses) == (0, 1)


def test_disabled_cache_always_compiles(tmp_path):
    cache = ExecutableCache(None, jax.devices()[:1])
    out = cache.get_or_compile("x", _compile(2.0))(jnp.zeros(4, jnp.float32))
    np.testing.assert_array_equal(np.asarray(out), 1.0)
    assert list(tmp_path.iterdir()) == []


def test_shutdown_frees_the_memory_maps_of_the_executables(tiny_checkpoints, xla_cache):
    """Each XLA:CPU executable holds its kernels in memory maps of its own, and a process
    may hold vm.max_map_count of them: engines built one after another (this suite) crashed
    in XLA once shut-down ones, waiting in reference cycles, had used them up."""
    from tests.engine.conftest import make_engine
    from tgix.engine.executables import memory_maps

    if memory_maps() is None:
        pytest.skip("no /proc here")
    before = memory_maps()[0]
    engine = make_engine(tiny_checkpoints("llama"), xla_cache)
    held = memory_maps()[0] - before
    engine.shutdown()
    assert held > 1000  # ~6,700: 32 executables
    assert memory_maps()[0] - before < held // 10


def test_start_up_warns_past_half_of_the_memory_map_limit(monkeypatch, caplog):
    from tgix.engine import factory

    monkeypatch.setattr(factory, "memory_maps", lambda: (32_000, 65_530))
    factory._check_memory_maps()
    assert not caplog.records
    monkeypatch.setattr(factory, "memory_maps", lambda: (40_000, 65_530))
    factory._check_memory_maps()
    assert "40000 of its 65530 memory maps (vm.max_map_count)" in caplog.text
    monkeypatch.setattr(factory, "memory_maps", lambda: None)  # no /proc
    factory._check_memory_maps()
    assert len(caplog.records) == 1
