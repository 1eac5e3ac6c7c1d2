"""The only module that compiles: one ahead-of-time executable per step shape, called directly.

At start-up `compile_all` lowers and compiles the model step for every StepShape of the
configured Buckets, the sampler for every (R, L) and the grammar mask for every R, so
serving never traces or compiles.
A restart loads them instead (CPU: serialized executables, executable_cache.py; GPU/TPU: JAX's
persistent compilation cache, which still traces but skips XLA's compile). The KV pages are
donated to each model step (updated in place, no copy). `run` dispatches a step
and returns device arrays at once; `fetch` reads them back, so the caller can do host work
(detokenizing the previous step) while the device computes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tgix.attention.backend import AttentionBackend
from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata
from tgix.engine.batch import HostStep
from tgix.engine.buckets import Buckets, StepShape
from tgix.engine.executable_cache import ExecutableCache
from tgix.engine.kv_cache import init_kv_pages
from tgix.engine.request import SamplingParams
from tgix.engine.sampling import SamplingArrays, prompt_scores, sample
from tgix.engine.sampling_host import pack_history, pack_sampling
from tgix.engine.token_mask import ALL_ALLOWED, apply_token_mask
from tgix.models import LoadedModel

logger = logging.getLogger(__name__)


def enable_compilation_cache(path: str | os.PathLike) -> None:
    """Turn on JAX's persistent cache (every executable, however fast it compiled)."""
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


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


class StepOutput(NamedTuple):
    """Per row: sampled id, its logprob, the top-n alternatives; per token (steps with
    all_logits) the logprob of the next prompt token and the top-n alternatives at that
    position (OpenAI's completions `echo` + `logprobs`). Device arrays until `fetch`."""

    token_ids: jax.Array  # [R] int32
    logprobs: jax.Array  # [R] f32
    top_ids: jax.Array  # [R, N] int32
    top_logprobs: jax.Array  # [R, N] f32
    prompt_logprobs: jax.Array | None = None  # [T] f32
    prompt_top_ids: jax.Array | None = None  # [T, N] int32
    prompt_top_logprobs: jax.Array | None = None  # [T, N] f32


@dataclasses.dataclass(frozen=True)
class RowSampling:
    """What the sampler needs of one row: its settings, the position of the token it is
    producing (seeded draws fold it in), and its token history: prompt + generated ids when
    it uses penalties, at least the previous token with a watermark, else empty."""

    params: SamplingParams
    position: int
    history: Sequence[int]


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
        self._params, self._params_def = jax.tree.flatten(self._state)
        param_dtype = jax.tree.leaves(self._state)[0].dtype
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
        self._vocab_limit = config.vocab_limit or self.cfg.vocab_size
        self._executables = ExecutableCache(config.executable_cache, list(self.mesh.devices.flat))
        self._base_description: str | None = None
        self._model_exec: dict[StepShape, Callable] = {}
        self._sampler_exec: dict[tuple[int, int], Callable] = {}
        self._mask_exec: dict[int, Callable] = {}
        self.compile_seconds = 0.0
        self.dispatched_at = 0.0  # monotonic time of the last model-step dispatch
        self.broadcast: Callable[[tuple], None] | None = None
        self.ran: set[tuple] = set()  # ("model" | "sampler" | "mask", shape) run at least once
        self._global_inputs = jax.process_count() > 1  # a group's executables take global arrays

    # -- compilation -----------------------------------------------------------------------------

    def _spec(self, shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self._replicated)

    def _model_step(self, params, token_ids, kv, md, logits_indices, *, shape: StepShape):
        """Logits [R, V] (and the prompt scores: logprobs [T], top-n ids and logprobs [T, N])
        come out replicated: on a mesh the LM head leaves V split over "model", and the
        sampler, the mask and every process's read-back take whole rows."""
        model = nnx.merge(self._graphdef, jax.tree.unflatten(self._params_def, params))
        whole = lambda a: jax.lax.with_sharding_constraint(a, self._replicated)
        if not shape.all_logits:
            logits, kv = model(token_ids, kv, md, logits_indices, fresh_rows=shape.fresh)
            return whole(logits), None, kv
        logits, kv = model(token_ids, kv, md, None, fresh_rows=shape.fresh)  # [T, V]
        next_ids = jnp.roll(token_ids, -1)  # prompt_lp[t] scores token t + 1
        scores = prompt_scores(logits, next_ids, self.config.num_top, self._vocab_limit)
        return whole(logits[logits_indices]), whole(scores), kv

    @functools.cached_property
    def attention(self) -> AttentionBackend:
        """The model's attention backend (its `pack` lays out every step)."""
        return nnx.merge(self._graphdef, self._state).attention

    def _describe(self, *what) -> str:
        """Everything that shapes a compiled program besides tgix's source and jax itself."""
        if self._base_description is None:
            leaves = jax.tree_util.tree_flatten_with_path((self._state, self.kv))[0]
            arrays = [
                (jax.tree_util.keystr(k), a.shape, str(a.dtype), str(a.sharding)) for k, a in leaves
            ]
            c = self.config
            backend = self.attention.name
            knobs = (c.num_top, self._vocab_limit, c.watermark_gamma, c.watermark_delta, backend)
            self._base_description = repr((self.cfg, knobs, dict(self.mesh.shape), arrays))
        return repr(what) + self._base_description

    def _compile_model(self, shape: StepShape):
        return self._executables.get_or_compile(
            self._describe("model", shape), lambda: self._lower_model(shape).compile()
        )

    def _lower_model(self, shape: StepShape):
        t, r, p = shape.num_tokens, shape.num_rows, shape.pages_per_row
        md = AttentionMetadata(
            positions=self._spec((t,)),
            slot_mapping=self._spec((t,)),
            token_rows=self._spec((t,)),
            cu_q_lens=self._spec((r + 1,)),
            kv_lens=self._spec((r,)),
            page_table=self._spec((r, p)),
        )
        as_spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        fn = jax.jit(functools.partial(self._model_step, shape=shape), donate_argnums=(2,))
        lowered = fn.lower(
            [as_spec(p) for p in self._params],
            self._spec((t,)),
            jax.tree.map(as_spec, self.kv),
            md,
            self._spec((r,)),
        )
        return lowered

    def _compile_sampler(self, rows: int, history: int):
        return self._executables.get_or_compile(
            self._describe("sampler", rows, history),
            lambda: self._lower_sampler(rows, history).compile(),
        )

    def _lower_sampler(self, rows: int, history: int):
        fn = jax.jit(
            functools.partial(
                sample,
                num_top=self.config.num_top,
                vocab_limit=self._vocab_limit,
                watermark_gamma=self.config.watermark_gamma,
                watermark_delta=self.config.watermark_delta,
            )
        )
        arrays = pack_sampling([], rows)
        return fn.lower(
            self._spec((rows, self.cfg.vocab_size), jnp.float32),
            SamplingArrays(**{k: self._spec(v.shape, v.dtype) for k, v in arrays.items()}),
            self._spec((rows,)),
            self._spec((rows, history)),
        )

    def _compile_mask(self, rows: int):
        def lower():
            words = -(-self.cfg.vocab_size // 32)
            return (
                jax.jit(apply_token_mask)
                .lower(
                    self._spec((rows, self.cfg.vocab_size), jnp.float32),
                    self._spec((rows, words), jnp.uint32),
                )
                .compile()
            )

        return self._executables.get_or_compile(self._describe("mask", rows), lower)

    def compile_all(self, progress: bool = True) -> float:
        """Compile every shape the buckets allow (a progress bar on stderr); returns seconds.

        Two at a time: tracing holds the GIL but XLA's compile releases it, so a second
        thread compiles while the first traces (cold start-up ~1.25x faster on 2 cores)."""
        from concurrent.futures import ThreadPoolExecutor

        from tqdm import tqdm

        work = [("model", s) for s in self.config.buckets.model_shapes()]
        work += [("sampler", s) for s in self.config.buckets.sampler_shapes()]
        work += [("mask", r) for r in sorted({r for r, _ in self.config.buckets.sampler_shapes()})]
        compilers = {"model": self._compile_model, "sampler": self._compile_sampler}
        compilers["mask"] = self._compile_mask
        tables = {"model": self._model_exec, "sampler": self._sampler_exec}
        tables["mask"] = self._mask_exec
        todo = [(kind, key) for kind, key in work if key not in tables[kind]]
        start = time.perf_counter()

        def build(item):
            kind, key = item
            args = key if kind == "sampler" else (key,)
            return item, compilers[kind](*args)

        workers = max(1, min(2, os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            bar = tqdm(total=len(todo), desc="compiling", unit="step", disable=not progress)
            for (kind, key), executable in pool.map(build, todo):
                tables[kind][key] = executable
                bar.update()
            bar.close()
        self.compile_seconds = time.perf_counter() - start
        return self.compile_seconds

    @property
    def num_executables(self) -> int:
        return len(self._model_exec) + len(self._sampler_exec) + len(self._mask_exec)

    def model_for(self, shape: StepShape):
        if shape not in self._model_exec:  # only when compile_all was skipped (tests, tools)
            logger.warning("compiling %s during serving", shape)
            self._model_exec[shape] = self._compile_model(shape)
        return self._model_exec[shape]

    def sampler_for(self, rows: int, history: int):
        if (rows, history) not in self._sampler_exec:
            logger.warning("compiling sampler %s during serving", (rows, history))
            self._sampler_exec[rows, history] = self._compile_sampler(rows, history)
        return self._sampler_exec[rows, history]

    def mask_for(self, rows: int):
        if rows not in self._mask_exec:
            logger.warning("compiling grammar mask %d during serving", rows)
            self._mask_exec[rows] = self._compile_mask(rows)
        return self._mask_exec[rows]

    # -- serving ---------------------------------------------------------------------------------

    def run(
        self,
        rows: Sequence,
        sampling: Sequence[RowSampling],
        *,
        prompt_logprobs: bool = False,
        device_token_ids: jax.Array | None = None,
        token_masks: Sequence[np.ndarray | None] | None = None,
    ) -> StepOutput:
        """Dispatch one step: rows (ScheduledRow-like: token_ids, start_pos, pages) and one
        RowSampling per row. Returns device arrays; nothing waits for the device.
        `device_token_ids` [T] replaces the rows' ids with a device array (the previous decode
        step's sampled ids, same rows in the same order), so this step can be sent before
        those ids are read back. `token_masks`: per row a grammar's packed allowed-token
        words [W] uint32, or None (unconstrained)."""
        shape = self.config.buckets.shape_for(rows, all_logits=prompt_logprobs)
        packed = self.attention.pack(
            rows,
            page_size=self.config.page_size,
            num_tokens=shape.num_tokens,
            num_rows=shape.num_rows,
            pages_per_row=shape.pages_per_row,
        )
        history_len = self._history_len(sampling)
        positions = np.zeros(shape.num_rows, np.int32)
        positions[: len(sampling)] = [s.position for s in sampling]
        host = HostStep(
            shape=shape,
            history_len=history_len,
            token_ids=packed["token_ids"],
            metadata={k: packed[k] for k in METADATA_FIELDS},
            logits_indices=packed["logits_indices"],
            sampling=pack_sampling([s.params for s in sampling], shape.num_rows),
            positions=positions,
            history=pack_history([s.history for s in sampling], shape.num_rows, history_len),
            masks=self._pack_masks(token_masks, shape.num_rows),
        )
        if self.broadcast is not None:  # other processes run the same step (lockstep.py)
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
        )
        if self._global_inputs:
            arrays = jax.device_put(arrays, self._replicated)
        # else numpy goes straight to the executables, which copy it in far faster than
        # device_put does (~40 us vs ~300 us for a step's twenty small arrays on CPU)
        token_ids, md, logits_indices, sampling, positions, history, masks = arrays
        if device_token_ids is not None:
            if device_token_ids.shape != token_ids.shape:
                raise ValueError(f"device ids {device_token_ids.shape} for {token_ids.shape}")
            token_ids = device_token_ids
        self.dispatched_at = time.monotonic()
        logits, prompt = self.call_model(shape, token_ids, md, logits_indices)
        if masks is not None:
            logits = self.mask_for(shape.num_rows)(logits, masks)
            self.ran.add(("mask", shape.num_rows))
        sampled = self.sampler_for(shape.num_rows, host.history_len)(
            logits, SamplingArrays(**sampling), positions, history
        )
        self.ran.add(("sampler", (shape.num_rows, host.history_len)))
        return StepOutput(*sampled, *(prompt or ()))

    def call_model(self, shape: StepShape, token_ids, metadata: dict, logits_indices):
        """The model step alone (KV pages donated and replaced): logits [R, V] and the prompt
        scores (logprobs [T], top ids [T, N], top logprobs [T, N]) or None, device arrays."""
        self.ran.add(("model", shape))
        logits, prompt, self.kv = self.model_for(shape)(
            self._params, token_ids, self.kv, AttentionMetadata(**metadata), logits_indices
        )
        return logits, prompt

    def _pack_masks(self, token_masks, num_rows: int) -> np.ndarray | None:
        if not token_masks or all(m is None for m in token_masks):
            return None
        words = -(-self.cfg.vocab_size // 32)
        packed = np.full((num_rows, words), ALL_ALLOWED, dtype=np.uint32)
        for i, mask in enumerate(token_masks):
            if mask is not None:
                packed[i] = mask
        return packed

    def _history_len(self, sampling: Sequence[RowSampling]) -> int:
        lengths = self.config.buckets.history
        if not any(s.params.uses_penalties or s.params.watermark for s in sampling):
            return lengths[0]
        return lengths[-1]

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

    def kv_lost(self) -> bool:
        """The KV pages were donated to a step that failed: they must be rebuilt."""
        return any(layer.k.is_deleted() or layer.v.is_deleted() for layer in self.kv)
