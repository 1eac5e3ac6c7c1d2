"""Device mesh construction: axes ("data", "model") over the visible (or given) devices."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("data", "model")


def make_mesh(model: int = 1, data: int = 1, devices=None) -> Mesh:
    """A (data, model) mesh over the first data * model devices.

    The model axis carries tensor parallelism (heads, MLP width, KV heads); the data axis
    carries independent replicas.
    """
    devices = list(jax.devices() if devices is None else devices)
    needed = data * model
    if needed > len(devices) or needed < 1:
        raise ValueError(
            f"a mesh of data={data} x model={model} needs {needed} devices; "
            f"{len(devices)} are visible"
        )
    return Mesh(np.array(devices[:needed]).reshape(data, model), AXES)
