"""Checkpoint readers: tensors by Hugging Face name, one at a time, memory-mapped.

A source lists names and shapes cheaply and reads one tensor on demand, so the loader never
holds more than one tensor's host copy at a time. Safetensors are parsed here directly (the
format is an 8-byte length, a JSON header and raw little-endian data) because the `safetensors`
numpy API cannot read bfloat16; `ml_dtypes` (shipped with jax) provides the numpy dtypes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Protocol

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class CheckpointError(ValueError):
    """The checkpoint is missing, unsafe, incomplete or does not fit the model; names the tensor."""


class TensorSource(Protocol):
    """Tensors by Hugging Face parameter name (e.g. `model.layers.0.mlp.up_proj.weight`)."""

    def names(self) -> list[str]: ...

    def read(self, name: str) -> np.ndarray: ...


class SafetensorsFile:
    """One .safetensors file: header parsed eagerly, tensors as read-only memmap views."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            try:
                header = json.loads(f.read(header_len))
            except ValueError as e:
                raise CheckpointError(f"{path.name}: corrupt safetensors header ({e})") from e
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + header_len
        self._map: np.memmap | None = None

    def read(self, name: str) -> np.ndarray:
        entry = self.header[name]
        if entry["dtype"] not in _DTYPES:
            raise CheckpointError(f"{name}: unsupported safetensors dtype {entry['dtype']}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        begin, end = entry["data_offsets"]
        raw = self._map[self.data_start + begin : self.data_start + end]
        return raw.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


class SafetensorsSource:
    """A Hugging Face model folder: `model.safetensors`, or shards listed by an index json."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise CheckpointError(
                    f"{folder} holds only pickled weights ({', '.join(pickles)}); pickle can run "
                    "arbitrary code, so tgix loads safetensors only: convert the checkpoint "
                    "(e.g. transformers `save_pretrained(..., safe_serialization=True)`)"
                )
            raise CheckpointError(f"no *.safetensors weights in {folder}")
        index = folder / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [folder / f for f in sorted(set(weight_map.values()))]
            for f in files:
                if not f.exists():
                    raise CheckpointError(f"shard {f.name} listed in {index.name} is missing")
        self._owner: dict[str, SafetensorsFile] = {}
        for f in files:
            st = SafetensorsFile(f)
            for name in st.header:
                if name in self._owner:
                    raise CheckpointError(
                        f"{name} appears in both {self._owner[name].path.name} and {f.name}"
                    )
                self._owner[name] = st

    def names(self) -> list[str]:
        return list(self._owner)

    def read(self, name: str) -> np.ndarray:
        return self._owner[name].read(name)
