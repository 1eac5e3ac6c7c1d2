"""tgix's int8 CPU kernel (tgix/models/cpu_int8.cc through XLA's FFI): it builds on this
machine, each product (int8 codes; the LM head's bfloat16 copy) equals its float64 definition
(weight-only: x is not rounded) at every row count the kernel blocks differently (8, 4, 2, 1
rows) and at widths that leave a partial 16-lane tail, a row's result is bit-equal alone and
beside any other rows, and a machine that cannot build it falls back to XLA's forms."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tgix.models import cpu_int8
from tgix.models.quant import NATIVE_MAX_ROWS, dequantize, qmatmul, quantize_rows


def test_the_kernel_builds_and_registers_here():
    assert cpu_int8.available()
    assert cpu_int8.library_path().exists()


@pytest.mark.parametrize("k", [7, 16, 40, 600])
@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 15, 17])
def test_products_equal_their_float64_definition(t, k):
    rng = np.random.default_rng(t * 1000 + k)
    n = 70  # two blocks of 32 outputs and a partial one
    codes, scale = quantize_rows(rng.standard_normal((n, k)).astype(np.float32), "eetq")
    x = rng.standard_normal((t, k)).astype(np.float32)
    want = x.astype(np.float64) @ dequantize(codes, scale).T.astype(np.float64)
    got = np.asarray(jax.jit(cpu_int8.int8_matmul)(x, codes, scale))
    assert got.shape == (t, n) and got.dtype == np.float32
    # float32 sums of k terms: relative to the terms' magnitudes, not the result's
    bound = 1e-6 * np.sqrt(k) * (np.abs(x) @ np.abs(dequantize(codes, scale)).T)
    assert (np.abs(got - want) <= bound + 1e-30).all()


@pytest.mark.parametrize("t", [1, 4, 11])
def test_bf16_products_equal_their_float64_definition(t):
    """The LM head's bfloat16 copy: each weight widened exactly, summed in float32."""
    rng = np.random.default_rng(t)
    weight = jnp.asarray(rng.standard_normal((45, 40)), jnp.bfloat16)  # [N, K], K % 16 = 8
    x = rng.standard_normal((t, 40)).astype(np.float32)
    exact = np.asarray(weight, np.float64)
    want = x.astype(np.float64) @ exact.T
    got = np.asarray(jax.jit(cpu_int8.bf16_matmul)(x, weight))
    assert got.shape == (t, 45) and got.dtype == np.float32
    bound = 1e-6 * np.sqrt(40) * (np.abs(x) @ np.abs(exact).T)
    assert (np.abs(got - want) <= bound).all()


def test_a_rows_product_does_not_depend_on_the_rest_of_the_step():
    rng = np.random.default_rng(7)
    codes, scale = quantize_rows(rng.standard_normal((300, 584)).astype(np.float32), "eetq")
    row = rng.standard_normal((1, 584)).astype(np.float32)
    product = jax.jit(cpu_int8.int8_matmul)
    alone = np.asarray(product(row, codes, scale))
    for t in (2, 3, 8, 13, 64):  # large enough steps split the outputs over threads
        x = rng.standard_normal((t, 584)).astype(np.float32)
        x[t // 2] = row[0]
        np.testing.assert_array_equal(np.asarray(product(x, codes, scale))[t // 2], alone[0])


def test_qmatmul_routes_to_it_and_keeps_the_input_dtype():
    rng = np.random.default_rng(8)
    codes, scale = quantize_rows(rng.standard_normal((48, 64)).astype(np.float32), "eetq")
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.bfloat16)
    got = qmatmul(x, jnp.asarray(codes), jnp.asarray(scale), native=True)
    assert got.dtype == jnp.bfloat16
    want = np.asarray(x, np.float32) @ dequantize(codes, scale).T
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2)
    lowered = jax.jit(lambda x: qmatmul(x, codes, scale, native=True)).lower(x).as_text()
    assert cpu_int8.TARGET in lowered


def test_prompts_of_many_rows_run_xlas_float_gemm_on_the_same_weights():
    rng = np.random.default_rng(10)
    codes, scale = quantize_rows(rng.standard_normal((20, 48)).astype(np.float32), "eetq")
    weights = dequantize(codes, scale)
    for t in (NATIVE_MAX_ROWS - 1, NATIVE_MAX_ROWS):
        x = jnp.asarray(rng.standard_normal((t, 48)), jnp.float32)
        product = jax.jit(lambda x: qmatmul(x, codes, scale, native=True))
        assert (cpu_int8.TARGET in product.lower(x).as_text()) == (t < NATIVE_MAX_ROWS)
        want = np.asarray(x, np.float64) @ weights.T.astype(np.float64)
        np.testing.assert_allclose(np.asarray(product(x)), want, rtol=1e-5, atol=1e-5)


def test_a_machine_without_a_compiler_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TGIX_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(cpu_int8.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="tgix.models.cpu_int8"):
        assert cpu_int8._load() is False
    assert "no C++ compiler" in caplog.text
    assert not list(tmp_path.iterdir())  # nothing half-built left behind


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("TGIX_CPU_KERNELS", "0")
    assert cpu_int8._load() is False


def test_a_failed_compile_leaves_no_file(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cc"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_int8, "SOURCE", broken)
    with pytest.raises(RuntimeError, match="failed"):
        cpu_int8._build(tmp_path / "out" / "k.so")
    assert not list((tmp_path / "out").iterdir())


_SAVE_OR_LOAD = """
import sys
import jax, numpy as np
from tgix.engine.executable_cache import ExecutableCache
from tgix.models import cpu_int8
assert cpu_int8.available()  # registers the target before an executable that calls it loads
rng = np.random.default_rng(9)
codes = rng.integers(-127, 128, (40, 24), dtype=np.int8)
scale = rng.random(40, dtype=np.float32)
x = rng.standard_normal((3, 24)).astype(np.float32)
compile = lambda: jax.jit(cpu_int8.int8_matmul).lower(x, codes, scale).compile()
cache = ExecutableCache(sys.argv[1], jax.devices()[:1])
y = np.asarray(cache.get_or_compile("int8", compile)(x, codes, scale))
print(cache.hits, cache.misses, y.tobytes().hex())
"""


def test_a_saved_executable_that_calls_it_loads_in_a_new_process(tmp_path):
    import subprocess
    import sys

    runs = [
        subprocess.run(
            [sys.executable, "-c", _SAVE_OR_LOAD, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.split()  # fmt: skip
        for _ in range(2)
    ]
    assert runs[0][:2] == ["0", "1"] and runs[1][:2] == ["1", "0"]
    assert runs[0][2] == runs[1][2]
