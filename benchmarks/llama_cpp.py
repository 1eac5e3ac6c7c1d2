"""llama.cpp's native `llama-server` as a serving peer, built once from the llama.cpp sources
bundled in the `llama-cpp-python` sdist on PyPI.

    python -m benchmarks.llama_cpp build            # once: ~15 min on 2 cores
    python -m benchmarks.llama_cpp serve [--port 8090] [--parallel 32]

`build` downloads the sdist (pip, no binary), configures `vendor/llama.cpp` with CMake
(Release, native CPU flags, static, no curl/SSL/web UI) and builds only the `llama-server`
target; the binary lands in `$TGIX_CACHE/llama.cpp/<version>/llama-server` and later builds
are skipped. `llama-cpp-python`'s own Python server runs one request at a time, so it is no
fair peer under concurrency; `llama-server --parallel N` keeps N slots with continuous
batching. `serve` starts it on the default model's GGUF (the same file tgix dequantizes) and
`launch` is what benchmarks.peers uses.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks.harness import wait_healthy

VERSION = "0.3.36"  # llama-cpp-python sdist; its vendor/llama.cpp is what gets built


def cache_dir() -> Path:
    root = os.environ.get("TGIX_CACHE") or Path.home() / ".cache" / "tgix"
    return Path(root) / "llama.cpp" / VERSION


def binary() -> Path:
    return cache_dir() / "llama-server"


def build(jobs: int | None = None) -> Path:
    """Build llama-server into the cache folder (no-op when it is already there)."""
    target = binary()
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="llama-cpp-build-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", str(work)],
            check=True,
        )  # fmt: skip
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = work / "build"
        options = {
            "CMAKE_BUILD_TYPE": "Release",
            "BUILD_SHARED_LIBS": "OFF",
            "GGML_NATIVE": "ON",
            "LLAMA_BUILD_TESTS": "OFF",
            "LLAMA_BUILD_EXAMPLES": "OFF",
            "LLAMA_BUILD_TOOLS": "ON",
            "LLAMA_BUILD_SERVER": "ON",
            "LLAMA_CURL": "OFF",
            "LLAMA_OPENSSL": "OFF",
            "LLAMA_USE_PREBUILT_UI": "OFF",
        }
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build_dir), *generator,
             *(f"-D{k}={v}" for k, v in options.items())],
            check=True,
        )  # fmt: skip
        subprocess.run(
            ["cmake", "--build", str(build_dir), "--target", "llama-server",
             "-j", str(jobs or os.cpu_count() or 2)],
            check=True,
        )  # fmt: skip
        built = next(build_dir.rglob("llama-server"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
    return target


def launch(
    gguf: str | Path,
    *,
    port: int,
    parallel: int = 32,
    slot_context: int = 512,
    threads: int | None = None,
    log_path: str | Path | None = None,
    timeout_s: float = 120.0,
) -> subprocess.Popen:
    """Start llama-server on 127.0.0.1:`port` with `parallel` slots of `slot_context` tokens
    each (continuous batching), and wait until /health answers 200."""
    if not binary().exists():
        raise SystemExit("llama-server is not built: python -m benchmarks.llama_cpp build")
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 (owned by the process)
    args = [
        str(binary()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(parallel), "--cont-batching", "-c", str(parallel * slot_context),
        "-t", str(threads or os.cpu_count() or 2), "--no-webui",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(port, proc, timeout_s)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build llama-server into the cache folder")
    serve = sub.add_parser("serve", help="serve the default model's GGUF until Ctrl-C")
    serve.add_argument("--port", type=int, default=8090)
    serve.add_argument("--parallel", type=int, default=32)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build())
        return 0
    from tgix.models.hub import default_model_file

    proc = launch(default_model_file(), port=args.port, parallel=args.parallel, log_path=None)
    print(f"llama-server on http://127.0.0.1:{args.port} (pid {proc.pid}); Ctrl-C stops it")
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
