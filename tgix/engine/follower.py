"""Processes 1..n-1 of a group: repeat process 0's steps on their own devices.

Process 0's Runner publishes (Runner.broadcast) its RunnerConfig once, then every HostStep
and KV reset; a follower builds the same Runner from that config, compiles the same
executables in the same order, and replays the messages, so each compiled step's collectives
find every process. Sampled ids stay on device here: only process 0 reads them.
"""

from __future__ import annotations

import logging

import jax

from tgix.engine.runner import Runner, RunnerConfig
from tgix.models import LoadedModel

logger = logging.getLogger(__name__)


def follow(loaded: LoadedModel, channel, *, progress: bool = False) -> int:
    """Build the leader's Runner and replay its steps until it says stop; returns 0."""
    kind, config = channel.receive()
    if kind != "config" or not isinstance(config, RunnerConfig):
        raise RuntimeError(f"expected the runner config first, got {kind!r}")
    runner = Runner(loaded, config)
    runner.executables.compile_all(progress=progress)
    logger.info("follower ready: %d executables", len(runner.executables))
    last = None
    steps = 0
    while True:
        message = channel.receive()
        if message[0] == "stop":
            logger.info("follower stopping after %d steps", steps)
            return 0
        if message[0] == "reset_kv":
            runner.reset_kv()
            continue
        _, host, chained = message
        last = runner.dispatch(host, last.token_ids if chained and last is not None else None)
        jax.block_until_ready(last.token_ids)  # bound the queue; process 0 paces the group
        steps += 1
