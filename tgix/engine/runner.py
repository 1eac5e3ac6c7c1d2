"""The device side of serving: the model's parameters, the KV pages, and each step's dispatch.

The Runner holds the device state and its StepExecutables (executables.py: every step shape
compiled ahead of time by `compile_all`, so serving never traces or compiles). `run` packs a
step's rows on the host (step_inputs.py), then `dispatch` sends it: the model step (KV pages
donated, updated in place, no copy), the grammar mask, the sampler, and returns device
arrays at once; `fetch` reads them back, so the caller can do host work (detokenizing the
previous step) while the device computes. In a multi-process group, process 0's `broadcast`
sends every HostStep and KV reset to the followers (follower.py) first.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tgix.attention.backend import AttentionBackend
from tgix.attention.contract import AttentionMetadata
from tgix.engine.batch import HostStep
from tgix.engine.buckets import Buckets, StepShape
from tgix.engine.executables import StepExecutables, enable_compilation_cache
from tgix.engine.kv_cache import init_kv_pages
from tgix.engine.sampling import SamplingArrays
from tgix.engine.step_inputs import RowSampling, pack_host_step, prompt_images
from tgix.models import LoadedModel

__all__ = ["RowSampling", "Runner", "RunnerConfig", "StepOutput", "enable_compilation_cache"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    num_pages: int
    page_size: int
    buckets: Buckets
    num_top: int = 0  # alternatives per token (TGI's max_top_n_tokens)
    vocab_limit: int | None = None  # tokenizer's vocab size (model V may be padded)
    kv_dtype: object = None  # None: the model's dtype
    watermark_gamma: float = 0.5
    watermark_delta: float = 2.0
    executable_cache: str | None = None  # folder for serialized executables (None: off)
    draft_head_rows: int = 0  # steps of at most this many rows run the Medusa heads (if any)


class StepOutput(NamedTuple):
    """Per row (per token in a verify step): sampled id, its logprob, the top-n
    alternatives; per token (steps with all_logits) the logprob of the next prompt token
    and the top-n alternatives at that position (OpenAI's completions `echo` +
    `logprobs`). Device arrays until `fetch`."""

    token_ids: jax.Array  # [R] int32
    logprobs: jax.Array  # [R] f32
    top_ids: jax.Array  # [R, N] int32
    top_logprobs: jax.Array  # [R, N] f32
    prompt_logprobs: jax.Array | None = None  # [T] f32
    prompt_top_ids: jax.Array | None = None  # [T, N] int32
    prompt_top_logprobs: jax.Array | None = None  # [T, N] f32
    draft_ids: jax.Array | None = None  # [R, M] int32: Medusa heads' guesses per sample
    expert_load: jax.Array | None = None  # [E] int32: MoE assignments per expert, all layers


class Runner:
    """Owns the device state (parameters, KV pages) and the compiled executables.

    `broadcast`, when set (process 0 of a multi-process group), receives every dispatched
    HostStep and every KV reset before the device does, so followers can repeat them."""

    def __init__(self, loaded: LoadedModel, config: RunnerConfig):
        self.config = config
        self.cfg = loaded.config
        self.mesh = loaded.mesh
        self._graphdef, self._state = nnx.split(loaded.model)
        # the executables take the parameters as a flat list: flattening nnx's State on
        # every call costs ~0.5 ms of host time a step
        self._params, params_def = jax.tree.flatten(self._state)
        param_dtype = loaded.model.embed_tokens.embedding[...].dtype  # linears may be codes
        self.param_bytes = loaded.weight_bytes
        kv_dtype = config.kv_dtype or param_dtype
        self.kv = init_kv_pages(
            self.cfg,
            config.num_pages,
            config.page_size,
            mesh=self.mesh,
            dtype=kv_dtype,
            attention=self.attention,
        )
        self._replicated = NamedSharding(self.mesh, P())
        self.executables = StepExecutables(
            loaded,
            config,
            graphdef=self._graphdef,
            state=self._state,
            params=self._params,
            params_def=params_def,
            kv=self.kv,
            attention=self.attention,
        )
        self.dispatched_at = 0.0  # monotonic time of the last model-step dispatch
        self.broadcast: Callable[[tuple], None] | None = None
        self.ran: set[tuple] = set()  # ("model" | "sampler" | "mask", shape) run at least once
        self._global_inputs = jax.process_count() > 1  # a group's executables take global arrays

    @functools.cached_property
    def attention(self) -> AttentionBackend:
        """The model's attention backend (its `pack` lays out every step)."""
        return nnx.merge(self._graphdef, self._state).attention

    # -- serving ---------------------------------------------------------------------------------

    def run(
        self,
        rows: Sequence,
        sampling: Sequence[RowSampling],
        *,
        prompt_logprobs: bool = False,
        device_token_ids: jax.Array | None = None,
        token_masks: Sequence[np.ndarray | None] | None = None,
        verify: bool = False,
        images: Sequence | None = None,
    ) -> StepOutput:
        """Dispatch one step: rows (PlanRow-like: token_ids, start_pos, pages) and one
        RowSampling per row. Returns device arrays; nothing waits for the device.
        `device_token_ids` [T] replaces the rows' ids with a device array (the previous decode
        step's sampled ids, same rows in the same order), so this step can be sent before
        those ids are read back. `token_masks`: per row a grammar's packed allowed-token
        words [W] uint32, or None (unconstrained). `verify`: decode rows with drafts, every
        token sampled (`sampling` and `token_masks` then hold one entry per token). `images`:
        per row its request's ImageSpans or None (step_inputs.request_images); None when no
        row's request has images."""
        in_prompt = None if verify else prompt_images(rows, images)
        shape = self.config.buckets.shape_for(
            rows, all_logits=prompt_logprobs, verify=verify, images=in_prompt is not None
        )
        rope_rows = None
        if self.cfg.mrope_section:  # every step of an M-RoPE model takes rope_positions
            rope_rows = images or [None] * len(rows)
        host = pack_host_step(
            self.attention,
            rows,
            sampling,
            shape,
            page_size=self.config.page_size,
            history_lengths=self.config.buckets.history,
            vocab_size=self.cfg.vocab_size,
            token_masks=token_masks,
            images=in_prompt,
            rope_rows=rope_rows,
        )
        if self.broadcast is not None:  # other processes run the same step (follower.py)
            self.broadcast(("step", host, device_token_ids is not None))
        return self.dispatch(host, device_token_ids)

    def dispatch(self, host: HostStep, device_token_ids: jax.Array | None = None) -> StepOutput:
        """Send one packed step to the device: the model, the grammar mask when any row has
        one, the sampler. Every process of a group calls this with the same `host`."""
        shape = host.shape
        arrays = (
            host.token_ids,
            host.metadata,
            host.logits_indices,
            host.sampling,
            host.positions,
            host.history,
            host.masks,
            host.extras,
        )
        if self._global_inputs:
            arrays = jax.device_put(arrays, self._replicated)
        # else numpy goes straight to the executables, which copy it in far faster than
        # device_put does (~40 us vs ~300 us for a step's twenty small arrays on CPU)
        token_ids, md, logits_indices, sampling, positions, history, masks, extras = arrays
        if device_token_ids is not None:
            if device_token_ids.shape != token_ids.shape:
                raise ValueError(f"device ids {device_token_ids.shape} for {token_ids.shape}")
            token_ids = device_token_ids
        self.dispatched_at = time.monotonic()
        logits, prompt, drafts, load = self.call_model(shape, token_ids, md, logits_indices, extras)
        if masks is not None:
            logits = self.executables.mask_for(shape.num_samples)(logits, masks)
            self.ran.add(("mask", shape.num_samples))
        sampled = self.executables.sampler_for(shape.num_samples, host.history_len)(
            logits, SamplingArrays(**sampling), positions, history
        )
        self.ran.add(("sampler", (shape.num_samples, host.history_len)))
        return StepOutput(*sampled, *(prompt or (None,) * 3), draft_ids=drafts, expert_load=load)

    def call_model(self, shape: StepShape, token_ids, metadata: dict, logits_indices, extras=None):
        """The model step alone (KV pages donated and replaced): logits [R, V], the prompt
        scores (logprobs [T], top ids [T, N], top logprobs [T, N]) or None, the Medusa
        heads' drafts [R, M] or None, and an MoE model's expert load [E] or None; device
        arrays. `extras`: HostStep.extras (image embeddings, M-RoPE positions) or None."""
        self.ran.add(("model", shape))
        logits, prompt, drafts, load, self.kv = self.executables.model_for(shape)(
            self._params, token_ids, self.kv, AttentionMetadata(**metadata), logits_indices,
            extras or {},
        )  # fmt: skip
        return logits, prompt, drafts, load

    @staticmethod
    def fetch(out: StepOutput) -> StepOutput:
        """Block until the step is done; numpy arrays."""
        return StepOutput(*(None if a is None else np.asarray(a) for a in out))

    def reset_kv(self) -> None:
        """Fresh zeroed pages (after a failed step whose donated buffers are gone)."""
        if self.broadcast is not None:
            self.broadcast(("reset_kv",))
        dtype = self.kv[0].k.dtype
        self.kv = init_kv_pages(
            self.cfg,
            self.config.num_pages,
            self.config.page_size,
            mesh=self.mesh,
            dtype=dtype,
            attention=self.attention,
        )

    def release(self) -> None:
        """Drop the executables (StepExecutables.clear says why) and the KV pages: at
        shutdown, once nothing runs."""
        self.executables.clear()
        self.kv = ()

    def kv_lost(self) -> bool:
        """The KV pages were donated to a step that failed: they must be rebuilt."""
        return any(layer.k.is_deleted() or layer.v.is_deleted() for layer in self.kv)
