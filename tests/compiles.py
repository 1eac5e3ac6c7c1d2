"""`recording_compiles()`: the JAX compile events while a block runs (serving must add none)."""

from __future__ import annotations

import contextlib

import jax.monitoring


@contextlib.contextmanager
def recording_compiles():
    """Yields a list that collects every `/jax/core/compile*` event inside the block."""
    compiles: list[str] = []

    def listener(event, duration, **kw):
        if event.startswith("/jax/core/compile"):
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
