"""tgix's own int8 matrix product on XLA:CPU (`cpu_int8.cc`, called through XLA's FFI).

    y [T, N] = (x [T, K] . codes [N, K]^T) * scale [N]     (x float32, codes int8)
    y [T, N] = x [T, K] . weight [N, K]^T                   (weight bfloat16: the LM head)

XLA:CPU has no fast form of this product: "convert then dot" writes a float32 copy of the
codes on every call, and the int8 x int8 dot (quant.py's two-digit activations) does twice the
integer work and still runs at ~10 GB/s of codes. The kernel widens each 16 codes to float32
in registers and multiplies them into up to 8 rows of x, so a decode step reads each weight
byte once, and the result is the weight-only product (no activation rounding: what TGI's eetq
computes on GPU). Each output is one fixed-order sum, so a row's result does not depend on
the other rows of its step (float32 GEMMs here are not batch-invariant). Measured per row
count in BENCHMARKS.md ("A native int8 kernel on CPU").

The source is compiled on first use with the machine's C++ compiler (`-march=native`: the
AVX-512 path where the CPU has it, a portable loop otherwise; ~2 s) into a cache folder
(`TGIX_KERNEL_CACHE`, default ~/.cache/tgix/kernels) under a name that digests the source,
the compile command, jaxlib's version and the CPU's feature flags, then loaded and registered
as the FFI target `tgix_int8_matmul`. No compiler, a failed compile or `TGIX_CPU_KERNELS=0`:
`available()` is False and quant.py keeps its XLA forms.

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

logger = logging.getLogger(__name__)

TARGET = "tgix_int8_matmul"
BF16_TARGET = "tgix_bf16_matmul"
SOURCE = Path(__file__).with_suffix(".cc")
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd", "-w")
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
    for part in (SOURCE.read_bytes(), " ".join(_FLAGS).encode(), jaxlib.__version__.encode()):
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
        command = [compiler, *_FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]
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
        for name, handler in ((TARGET, lib.TgixInt8Matmul), (BF16_TARGET, lib.TgixBf16Matmul)):
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
    except Exception as exc:  # a missing compiler or a failed build: the XLA forms still run
        logger.warning("tgix's int8 CPU kernel is unavailable (%s); using XLA's int8 forms", exc)
        return False
    _STATE["lib"] = lib
    return True


def int8_matmul(x: jax.Array, codes: jax.Array, scale: jax.Array) -> jax.Array:
    """x [T, K] @ (codes [N, K] int8, scale [N] float32) -> [T, N] in x's dtype, computed in
    float32 by the kernel (`available()` must be True)."""
    out = jax.ShapeDtypeStruct((x.shape[0], codes.shape[0]), jnp.float32)
    y = jax.ffi.ffi_call(TARGET, out)(x.astype(jnp.float32), codes, scale)
    return y.astype(x.dtype)


def bf16_matmul(x: jax.Array, weight: jax.Array) -> jax.Array:
    """x [T, K] @ weight [N, K] (bfloat16).T -> [T, N] float32: each weight widened exactly to
    float32 in registers (the LM head's bfloat16 copy under --quantize eetq: half the bytes of
    the float32 head, read once per 8 rows)."""
    out = jax.ShapeDtypeStruct((x.shape[0], weight.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(BF16_TARGET, out)(x.astype(jnp.float32), weight)
