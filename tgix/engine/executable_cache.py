"""Compiled step executables saved to disk, so a restart loads them instead of tracing.

JAX's persistent compilation cache skips XLA's compile, but every start still traces and
lowers the 30-layer model once per bucket (1-9 s each on CPU). Serialized executables skip
that too: the default model's 72 load in ~125 s where they compile in ~490 s (2 cores; a
big mixed step loads in 30 s, a small one in 0.4). Used on CPU instead of JAX's cache, never
with it: an XLA:CPU executable loaded from JAX's cache serializes incompletely. The key covers
everything that shapes the program: tgix's own source (any edit invalidates), jax/jaxlib
versions, the devices and mesh, and the caller's description of the step (model config,
shapes, dtypes, shardings). A file that fails to load is recompiled and replaced.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

import jax
import jaxlib
from jax.experimental import serialize_executable

logger = logging.getLogger(__name__)


@cache
def _source_digest() -> str:
    root = Path(__file__).resolve().parents[1]  # the tgix package
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.cc"), *root.rglob("*.h")]):  # kernels
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _environment() -> str:
    devices = jax.devices()
    return repr(
        (
            jax.__version__,
            jaxlib.__version__,
            jax.default_backend(),
            [(d.platform, d.device_kind) for d in devices],
            os.environ.get("XLA_FLAGS", ""),  # compiler options (fusion types, ISA)
            os.environ.get("TGIX_CPU_KERNELS", ""),  # FFI calls in the program or not
            _kernels_loaded(),
        )
    )


def _kernels_loaded() -> bool | None:
    """Whether tgix's CPU kernel is registered in this process (None: not asked yet): an
    executable that calls it must not load where it could not be built."""
    from tgix.models import cpu_int8

    return cpu_int8.loaded()


class ExecutableCache:
    """get_or_compile(description, compile) -> a loaded executable on `devices` (the mesh's
    devices, in order: a loaded executable otherwise spans every local device)."""

    def __init__(self, folder: str | os.PathLike | None, devices: Sequence[jax.Device]):
        self.folder = Path(folder) if folder else None
        self.devices = list(devices)
        self.hits = self.misses = 0

    def _path(self, description: str) -> Path:
        devices = repr([d.id for d in self.devices])
        key = hashlib.sha256(
            "\n".join((_source_digest(), _environment(), devices, description)).encode()
        ).hexdigest()
        return self.folder / f"{key[:40]}.exe"

    def get_or_compile(self, description: str, compile_fn: Callable[[], object]):
        if self.folder is None:
            return compile_fn()
        path = self._path(description)
        if path.exists():
            try:
                payload, in_tree, out_tree = pickle.loads(path.read_bytes())
                executable = serialize_executable.deserialize_and_load(
                    payload, in_tree, out_tree, execution_devices=self.devices
                )
                self.hits += 1
                return executable
            except Exception:  # stale or truncated: compile again
                logger.warning("could not load %s; recompiling", path, exc_info=True)
        executable = compile_fn()
        self.misses += 1
        if jax.config.jax_compilation_cache_dir:
            # XLA:CPU executables that came out of JAX's persistent cache serialize without
            # some of their functions ("... not found" when run after loading), and JAX
            # decides once per process whether it uses that cache: never save then.
            logger.warning("JAX's persistent compilation cache is on: not saving %s", path.name)
            return executable
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            blob = pickle.dumps(serialize_executable.serialize(executable))
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(blob)
            tmp.replace(path)  # atomic: concurrent starts never read half a file
        except Exception:
            logger.warning("could not save an executable to %s", path, exc_info=True)
        return executable
