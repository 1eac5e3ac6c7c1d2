"""tgix's CPU kernels (tgix/models/cpu_int8_packed.cc and cpu_int8.cc through XLA's FFI): they
build on this machine; `pack` lays codes out as the kernel reads them; the int8 product equals
its integer definition (x as two int8 digits, exact sums) at every tile shape the kernel
blocks differently (4, 2, 1 rows; panels of 3, 2, 1 blocks of 16 outputs; row chunks of 96)
and at widths that leave partial blocks; the portable loop (no AVX512-VNNI) gives the same
bits; a row's result is bit-equal alone and beside any other rows; the LM head's bfloat16
product equals its float64 definition; and a machine that cannot build them falls back to
XLA's forms."""

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tgix.models import cpu_int8
from tgix.models.quant import dequantize, qmatmul, quantize_rows

_DIGIT = np.float32(254)


def digits(x: np.ndarray):
    """The kernel's rounding of x [T, K] (float32 arithmetic, half to even), as integers."""
    absmax = np.abs(x).max(axis=1, keepdims=True)
    s = np.where(absmax > 0, absmax / np.float32(127), np.float32(1)).astype(np.float32)
    v = (x / s).astype(np.float32)
    high = np.rint(v)
    low = np.rint((v - high) * _DIGIT)
    return high.astype(np.int64), low.astype(np.int64), s


def definition(x, codes, scale):
    """y [T, N] from exact integer sums of both digit rows, joined in float64."""
    high, low, s = digits(x)
    c = codes.astype(np.int64).T
    return ((high @ c) + (low @ c) / 254.0) * s.astype(np.float64) * scale.astype(np.float64)


def product(x, codes, scale):
    packed = cpu_int8.pack(codes)
    return np.asarray(jax.jit(cpu_int8.packed_matmul)(x, packed, scale))


def test_the_kernels_build_and_register_here():
    assert cpu_int8.available()
    assert cpu_int8.library_path().exists()


def test_pack_lays_out_blocks_of_16_outputs_by_4_inputs():
    codes = np.arange(-100, 100, dtype=np.int8)[: 18 * 6].reshape(18, 6)  # N 18, K 6
    packed = cpu_int8.pack(codes)
    assert packed.shape == cpu_int8.packed_shape(18, 6) == (2, 2, 64) and packed.dtype == np.uint8
    for n in range(32):
        for k in range(8):
            want = int(codes[n, k]) + 128 if n < 18 and k < 6 else 128  # padding: code 0
            assert packed[n // 16, k // 4, (n % 16) * 4 + k % 4] == want


@pytest.mark.parametrize("k", [7, 16, 40, 600])
@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 7, 17, 101])
def test_products_equal_their_integer_definition(t, k):
    rng = np.random.default_rng(t * 1000 + k)
    n = 70  # a panel of 3 blocks, then 2 blocks with a partial one
    codes, scale = quantize_rows(rng.standard_normal((n, k)).astype(np.float32), "eetq")
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0, : k // 2] = 0.0  # zeros and a row's largest value round exactly
    got = product(x, codes, scale)
    assert got.shape == (t, n) and got.dtype == np.float32
    want = definition(x, codes, scale)
    # integer sums are exact: what is left is float32's rounding of the join
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    # and the digits stand for x to 1/(2 * 254) of s per element
    weights = dequantize(codes, scale).astype(np.float64)
    weight_only = x.astype(np.float64) @ weights.T
    s = np.abs(x).max(axis=1, keepdims=True) / 127
    bound = s / 508 * np.abs(weights).sum(axis=1)[None, :]
    assert (np.abs(got - weight_only) <= bound * 1.01 + 1e-5 * np.abs(want).max()).all()


def test_an_all_zero_row_is_zero():
    codes, scale = quantize_rows(np.ones((20, 12), np.float32), "eetq")
    got = product(np.zeros((3, 12), np.float32), codes, scale)
    assert not got.any()


def test_a_rows_product_does_not_depend_on_the_rest_of_the_step():
    rng = np.random.default_rng(7)
    codes, scale = quantize_rows(rng.standard_normal((300, 584)).astype(np.float32), "eetq")
    packed = cpu_int8.pack(codes)
    row = rng.standard_normal((1, 584)).astype(np.float32)
    run = jax.jit(cpu_int8.packed_matmul)
    alone = np.asarray(run(row, packed, scale))
    for t in (2, 3, 8, 13, 64, 200):  # large enough steps split the work over threads
        x = rng.standard_normal((t, 584)).astype(np.float32)
        x[t // 2] = row[0]
        np.testing.assert_array_equal(np.asarray(run(x, packed, scale))[t // 2], alone[0])


_PORTABLE = """
import pickle, sys
import jax, numpy as np
from tgix.models import cpu_int8
cpu_int8._FLAGS = (*cpu_int8._FLAGS, "-mno-avx512vnni")  # the loop a CPU without VNNI runs
assert cpu_int8.available()
x, codes, scale = pickle.loads(sys.stdin.buffer.read())
y = jax.jit(cpu_int8.packed_matmul)(x, cpu_int8.pack(codes), scale)
sys.stdout.buffer.write(np.asarray(y).tobytes())
"""


def test_the_portable_loop_gives_the_same_bits(tmp_path):
    import pickle

    rng = np.random.default_rng(11)
    codes, scale = quantize_rows(rng.standard_normal((37, 90)).astype(np.float32), "eetq")
    x = rng.standard_normal((6, 90)).astype(np.float32)
    done = subprocess.run(
        [sys.executable, "-c", _PORTABLE],
        input=pickle.dumps((x, codes, scale)),
        capture_output=True,
        env={**os.environ, "TGIX_KERNEL_CACHE": str(tmp_path)},
        timeout=300,
        check=True,
    )
    portable = np.frombuffer(done.stdout, np.float32).reshape(6, 37)
    np.testing.assert_array_equal(portable, product(x, codes, scale))


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


@pytest.mark.parametrize("t", [3, 500])  # a decode step and a prompt: one kernel for both
def test_qmatmul_routes_to_it_and_keeps_the_input_dtype(t):
    rng = np.random.default_rng(8)
    codes, scale = quantize_rows(rng.standard_normal((48, 64)).astype(np.float32), "eetq")
    packed = cpu_int8.pack(codes)
    x = jnp.asarray(rng.standard_normal((t, 64)), jnp.bfloat16)
    got = qmatmul(x, jnp.asarray(packed), jnp.asarray(scale), native=True)
    assert got.dtype == jnp.bfloat16
    want = np.asarray(x, np.float32) @ dequantize(codes, scale).T
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2)
    lowered = jax.jit(lambda x: qmatmul(x, packed, scale, native=True)).lower(x).as_text()
    assert cpu_int8.PACKED_TARGET in lowered


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
    assert not cpu_int8.available() and not cpu_int8.fast()


def test_a_failed_compile_leaves_no_file(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cc"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_int8, "SOURCES", (broken,))
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
packed = cpu_int8.pack(rng.integers(-127, 128, (40, 24), dtype=np.int8))
scale = rng.random(40, dtype=np.float32)
x = rng.standard_normal((3, 24)).astype(np.float32)
compile = lambda: jax.jit(cpu_int8.packed_matmul).lower(x, packed, scale).compile()
cache = ExecutableCache(sys.argv[1], jax.devices()[:1])
y = np.asarray(cache.get_or_compile("int8", compile)(x, packed, scale))
print(cache.hits, cache.misses, y.tobytes().hex())
"""


def test_a_saved_executable_that_calls_it_loads_in_a_new_process(tmp_path):
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
