"""tgix's own matrix products on XLA:CPU (`cpu_int8_packed.cc`, `cpu_int8.cc`), called
through XLA's FFI:

    y [T, N] = (x [T, K] . codes [N, K]^T) * scale [N]   int8 codes, packed (`pack`): the
                                                         quantized linear layers
    y [T, N] = x [T, K] . weight [N, K]^T                 bfloat16 weight: the LM head's copy

XLA:CPU has no fast form of the int8 product: "convert then dot" writes a float32 copy of the
codes on every call, and its int8 x int8 dot (quant.py's two-digit activations) runs at a
fraction of the machine's integer rate. The packed kernel writes each row of x as the same
two int8 digits (quant.split_activations' rounding, 1/64,000 of the row's largest value) and
multiplies them into the codes with AVX512-VNNI (64 multiply-adds an instruction, exact int32
sums), in tiles of rows x outputs held in registers, from codes packed once at load time
(`pack`: [N/16, K/4, 16, 4] bytes, the shape of one vpdpbusd). Integer sums are exact, so a
row's result does not depend on the other rows of its step. Measured per row count in
BENCHMARKS.md ("Packed codes and AVX512-VNNI").

The sources are compiled on first use with the machine's C++ compiler (`-march=native`: the
AVX512-VNNI / AVX-512 paths where the CPU has them, portable loops otherwise; a few seconds)
into a cache folder (`TGIX_KERNEL_CACHE`, default ~/.cache/tgix/kernels) under a name that
digests the sources, the compile command, jaxlib's version and the CPU's feature flags, then
loaded and registered as FFI targets. No compiler, a failed compile or `TGIX_CPU_KERNELS=0`:
`available()` is False and quant.py keeps its XLA forms; without AVX512-VNNI (`fast()`) the
portable loop is correct but slower than those forms, and is not the default.

GSPMD cannot partition an opaque call, so quant.py routes to it only on a one-device mesh
(each data-parallel replica is one).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger(__name__)

BF16_TARGET = "tgix_bf16_matmul"
SOURCES = (Path(__file__).with_suffix(".cc"), Path(__file__).with_name("cpu_int8_packed.cc"))
HEADERS = (Path(__file__).with_name("cpu_pool.h"),)  # included by SOURCES: in the digest too
PACKED_TARGET = "tgix_int8_packed_matmul"
_FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp-simd",
    "-ffp-contract=off",
    "-w",
)
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # "ok": bool once decided; "lib": the loaded library


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _cache_folder() -> Path:
    folder = os.environ.get("TGIX_KERNEL_CACHE")
    return Path(folder) if folder else Path.home() / ".cache" / "tgix" / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def library_path() -> Path:
    """Where this machine's build of the kernel lives (built or not)."""
    import jaxlib

    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    for part in (" ".join(_FLAGS).encode(), jaxlib.__version__.encode()):
        digest.update(part)
    digest.update(_cpu_flags().encode())
    return _cache_folder() / f"cpu_int8-{digest.hexdigest()[:20]}.so"


def _build(target: Path) -> None:
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    # another process may build the same file: compile aside, then rename (atomic)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        command = [compiler, *_FLAGS, "-I", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def available() -> bool:
    """Whether the kernel is built, loaded and registered for XLA:CPU (decided once per
    process; building it the first time if needed). TGIX_CPU_KERNELS=0 is read on every call,
    so a process can compare both forms."""
    if os.environ.get("TGIX_CPU_KERNELS", "1") == "0":
        return False
    ok = _STATE.get("ok")
    if ok is not None:
        return bool(ok)
    with _LOCK:
        if "ok" not in _STATE:
            _STATE["ok"] = _load()
    return bool(_STATE["ok"])


def fast() -> bool:
    """Whether the packed kernel runs its AVX512-VNNI form here (`available()`, and the CPU
    has avx512_vnni and avx512bw): the default for int8 layers only then."""
    flags = _cpu_flags().split()
    return "avx512_vnni" in flags and "avx512bw" in flags and available()


def loaded() -> bool | None:
    """Whether the kernel is registered in this process, without building it (None: not
    decided yet)."""
    ok = _STATE.get("ok")
    return None if ok is None else bool(ok)


def _load() -> bool:
    if os.environ.get("TGIX_CPU_KERNELS", "1") == "0" or jax.default_backend() != "cpu":
        return False
    try:
        path = library_path()
        if not path.exists():
            logger.info("building tgix's int8 CPU kernel into %s", path)
            _build(path)
        lib = ctypes.cdll.LoadLibrary(str(path))
        for name, handler in (
            (BF16_TARGET, lib.TgixBf16Matmul),
            (PACKED_TARGET, lib.TgixInt8PackedMatmul),
        ):
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
    except Exception as exc:  # a missing compiler or a failed build: the XLA forms still run
        logger.warning("tgix's int8 CPU kernel is unavailable (%s); using XLA's int8 forms", exc)
        return False
    _STATE["lib"] = lib
    return True


def bf16_matmul(x: jax.Array, weight: jax.Array) -> jax.Array:
    """x [T, K] @ weight [N, K] (bfloat16).T -> [T, N] float32: each weight widened exactly to
    float32 in registers (the LM head's bfloat16 copy under --quantize eetq: half the bytes of
    the float32 head, read once per 8 rows)."""
    out = jax.ShapeDtypeStruct((x.shape[0], weight.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(BF16_TARGET, out)(x.astype(jnp.float32), weight)


def pack(codes) -> np.ndarray:
    """int8 codes [N, K] -> the packed layout of cpu_int8_packed.cc, uint8 [N/16, K/4, 64]
    (N and K rounded up; padding is code 0): block b, step k holds outputs 16b..16b+15, each
    with its inputs 4k..4k+3, every code + 128 as an unsigned byte."""
    codes = np.asarray(codes, np.int8)
    n, k = codes.shape
    n16, k4 = -(-n // 16) * 16, -(-k // 4) * 4
    unsigned = np.full((n16, k4), 128, np.uint8)
    unsigned[:n, :k] = codes.view(np.uint8) ^ 0x80  # two's complement + 128
    blocks = unsigned.reshape(n16 // 16, 16, k4 // 4, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks).reshape(n16 // 16, k4 // 4, 64)


def packed_shape(n: int, k: int) -> tuple[int, int, int]:
    """The shape `pack` gives codes [n, k]."""
    return -(-n // 16), -(-k // 4), 64


def packed_matmul(x: jax.Array, packed: jax.Array, scale: jax.Array) -> jax.Array:
    """x [T, K] @ (packed codes [N/16, K/4, 64] from `pack`, scale [N]) -> [T, N] in x's
    dtype: each row of x as two int8 digits (quant.split_activations), exact integer sums."""
    out = jax.ShapeDtypeStruct((x.shape[0], scale.shape[0]), jnp.float32)
    y = jax.ffi.ffi_call(PACKED_TARGET, out)(x.astype(jnp.float32), packed, scale)
    return y.astype(x.dtype)
