"""Several processes serving one model: JAX's multi-controller runtime (`jax.distributed`).

Every process holds its own devices' shards of the weights and KV pages and runs every step;
the cross-process collectives inside the compiled steps (gloo on CPU, NCCL on GPU, ICI/DCN
on TPU) join them. Process 0 alone schedules: it publishes each step's packed host arrays
through the coordination service's key-value store (`Channel`), and the others replay them in
order. When any process stops sending heartbeats, the coordination service fails the whole
group (every process exits non-zero) within `heartbeat_timeout_s`, so an orchestrator
restarts it as one unit.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle

import jax

logger = logging.getLogger(__name__)

# Keys older than this many messages are deleted: followers are at most a step or two behind,
# since every model step holds a collective that waits for all processes.
_KEEP = 1024
_POLL_MS = 60_000


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """Where this process sits in a multi-process group."""

    coordinator_address: str  # host:port of process 0's coordination service
    num_processes: int
    process_id: int

    def __post_init__(self):
        if self.num_processes < 2:
            raise ValueError(f"a process group needs >= 2 processes, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process id {self.process_id} is outside 0..{self.num_processes - 1}")

    @property
    def is_leader(self) -> bool:
        return self.process_id == 0


def initialize(group: ProcessGroup, *, heartbeat_timeout_s: int = 10) -> None:
    """Join the group before anything touches a JAX backend. CPU collectives go through gloo
    (the default CPU backend has none across processes)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=group.coordinator_address,
        num_processes=group.num_processes,
        process_id=group.process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
        shutdown_timeout_seconds=heartbeat_timeout_s,
    )
    logger.info(
        "process %d of %d joined %s: %d local / %d global devices",
        group.process_id,
        group.num_processes,
        group.coordinator_address,
        jax.local_device_count(),
        jax.device_count(),
    )


class Channel:
    """An ordered message stream from process 0 to every other process (pickled objects over
    the coordination service's key-value store: no extra sockets, and it dies with the group).
    """

    def __init__(self, name: str = "tgix"):
        from jax._src.distributed import global_state

        if global_state.client is None:
            raise RuntimeError("jax.distributed is not initialized")
        self._client = global_state.client
        self._name = name
        self._seq = 0

    def _key(self, seq: int) -> str:
        return f"{self._name}/{seq}"

    def publish(self, message: object) -> None:
        """Process 0: append a message."""
        self._client.key_value_set_bytes(self._key(self._seq), pickle.dumps(message, 5))
        if self._seq >= _KEEP:
            self._client.key_value_delete(self._key(self._seq - _KEEP))
        self._seq += 1

    def receive(self) -> object:
        """Other processes: the next message, waiting as long as process 0 is idle."""
        key = self._key(self._seq)
        while True:
            try:
                data = self._client.blocking_key_value_get_bytes(key, _POLL_MS)
                break
            except Exception as exc:  # a deadline while process 0 has nothing to run
                if "DEADLINE_EXCEEDED" not in str(exc).upper():
                    raise
        self._seq += 1
        return pickle.loads(data)
