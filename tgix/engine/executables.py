"""The only place that compiles serving steps: an ahead-of-time executable for each step shape.

StepExecutables traces, lowers and compiles the model step for every StepShape of the
configured Buckets, the sampler for every (R, L) and the grammar mask for every R, two at a
time, at start-up (`compile_all`), so serving only looks them up (`model_for`, `sampler_for`,
`mask_for`). Each is keyed on disk by a description of everything that shapes the program
(config, sampler knobs, mesh, parameter and KV shapes, dtypes and shardings): a restart loads
them instead (CPU: serialized executables, executable_cache.py; GPU/TPU: JAX's persistent
compilation cache, `enable_compilation_cache`, which still traces but skips XLA's compile).
The model step's KV pages are donated (updated in place, no copy).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tgix.attention.contract import AttentionMetadata
from tgix.engine.buckets import StepShape
from tgix.engine.executable_cache import ExecutableCache
from tgix.engine.sampling import SamplingArrays, prompt_scores, sample
from tgix.engine.sampling_host import pack_sampling
from tgix.engine.token_mask import apply_token_mask

if TYPE_CHECKING:
    from tgix.attention.backend import AttentionBackend
    from tgix.engine.runner import RunnerConfig
    from tgix.models import LoadedModel

logger = logging.getLogger(__name__)


def memory_maps() -> tuple[int, int] | None:
    """(memory maps this process holds, the kernel's limit vm.max_map_count), or None where
    /proc does not say. XLA:CPU keeps each compiled kernel in maps of its own (see
    StepExecutables.clear): ~25,000 for the default model's 72 step programs."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            used = sum(1 for _ in maps)
        return used, int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def enable_compilation_cache(path: str | os.PathLike) -> None:
    """Turn on JAX's persistent cache (every executable, however fast it compiled)."""
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _as_spec(a) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)


class StepExecutables:
    """A Runner's compiled programs: the model step per StepShape, the sampler per (rows,
    history length), the grammar mask per rows. `config` is the Runner's RunnerConfig;
    `state` and `params` (its flat leaves, `params_def` their tree) are the model's, `kv`
    the KV pages (only their shapes, dtypes and shardings are read)."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: RunnerConfig,
        *,
        graphdef,
        state,
        params: list,
        params_def,
        kv,
        attention: AttentionBackend,
    ):
        self.config = config
        self.cfg = loaded.config
        self.mesh = loaded.mesh
        self.cache = ExecutableCache(config.executable_cache, list(self.mesh.devices.flat))
        self.compile_seconds = 0.0
        self._graphdef, self._state = graphdef, state
        self._params, self._params_def = params, params_def
        self._kv = jax.tree.map(_as_spec, kv)  # shapes only: the pages are donated each step
        self._attention_name = attention.name
        self._replicated = NamedSharding(self.mesh, P())
        self._vocab_limit = config.vocab_limit or self.cfg.vocab_size
        self._base_description: str | None = None
        self._model: dict[StepShape, Callable] = {}
        self._sampler: dict[tuple[int, int], Callable] = {}
        self._mask: dict[int, Callable] = {}

    # -- the traced programs ---------------------------------------------------------------------

    def _spec(self, shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self._replicated)

    def _model_step(self, params, token_ids, kv, md, logits_indices, extras, *, shape):
        """Logits [R, V] ([T, V] for a verify shape) (and the prompt scores: logprobs [T],
        top-n ids and logprobs [T, N]) come out replicated: on a mesh the LM head leaves V
        split over "model", and the sampler, the mask and every process's read-back take
        whole rows. With Medusa heads, steps of at most `draft_head_rows` rows also give
        the heads' drafts [R, M] at each sampled position (tgix/models/medusa.py). An MoE
        model also gives its expert load [E] (tgix/models/moe.py), else None. `extras`
        (HostStep.extras): a shape with images takes image_embeds [T, D] and image_marks
        [T]; an M-RoPE model rope_positions [3, T]."""
        model = nnx.merge(self._graphdef, jax.tree.unflatten(self._params_def, params))
        whole = lambda a: jax.lax.with_sharding_constraint(a, self._replicated)
        images = None
        if "image_embeds" in extras:
            images = (extras["image_embeds"], extras["image_marks"])
        more = dict(image_embeds=images, rope_positions=extras.get("rope_positions"))
        if not shape.all_logits:
            x, kv, load = model.hidden_states(
                token_ids, kv, md, logits_indices, fresh_rows=shape.fresh,
                tokenwise_rope=shape.verify, with_load=True, **more,
            )  # fmt: skip
            logits, prompt = model.logits(x), None
        else:
            x, kv, load = model.hidden_states(
                token_ids, kv, md, None, fresh_rows=shape.fresh, with_load=True, **more,
            )  # fmt: skip
            all_logits = model.logits(x)  # [T, V]
            next_ids = jnp.roll(token_ids, -1)  # prompt_lp[t] scores token t + 1
            prompt = whole(
                prompt_scores(all_logits, next_ids, self.config.num_top, self._vocab_limit)
            )
            x, logits = x[logits_indices], all_logits[logits_indices]
        drafts = None
        if model.medusa is not None and shape.num_rows <= self.config.draft_head_rows:
            drafts = whole(model.medusa(x, model.head_weight(), self._vocab_limit))
        load = None if load is None else whole(load)  # MoE: assignments per expert [E]
        return whole(logits), prompt, drafts, load, kv

    def _describe(self, *what) -> str:
        """Everything that shapes a compiled program besides tgix's source and jax itself."""
        if self._base_description is None:
            leaves = jax.tree_util.tree_flatten_with_path((self._state, self._kv))[0]
            arrays = [
                (jax.tree_util.keystr(k), a.shape, str(a.dtype), str(a.sharding)) for k, a in leaves
            ]
            c = self.config
            backend = self._attention_name
            knobs = (c.num_top, self._vocab_limit, c.watermark_gamma, c.watermark_delta, backend)
            knobs += (c.draft_head_rows,)
            # the graph's static attributes (an MoE block's expert path, a layer's quantized
            # form, the backend) shape the program as much as the arrays do
            graph = repr(self._graphdef)
            self._base_description = repr((self.cfg, knobs, dict(self.mesh.shape), arrays, graph))
        return repr(what) + self._base_description

    # -- lowering and compiling ------------------------------------------------------------------

    def _compile_model(self, shape: StepShape):
        return self.cache.get_or_compile(
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
            shared_pages=self._spec((r,)),
        )
        fn = jax.jit(functools.partial(self._model_step, shape=shape), donate_argnums=(2,))
        extras = {}
        if shape.images:  # embeddings [T, D] and which tokens take them [T]
            extras["image_embeds"] = self._spec((t, self.cfg.hidden_size), jnp.float32)
            extras["image_marks"] = self._spec((t,), jnp.bool_)
        if self.cfg.mrope_section:
            extras["rope_positions"] = self._spec((3, t))
        return fn.lower(
            [_as_spec(p) for p in self._params],
            self._spec((t,)),
            self._kv,
            md,
            self._spec((shape.num_samples,)),
            extras,
        )

    def _compile_sampler(self, rows: int, history: int):
        return self.cache.get_or_compile(
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

        return self.cache.get_or_compile(self._describe("mask", rows), lower)

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
        tables = {"model": self._model, "sampler": self._sampler, "mask": self._mask}
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

    # -- lookup while serving --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._model) + len(self._sampler) + len(self._mask)

    def clear(self) -> None:
        """Drop every executable (at shutdown). An XLA:CPU executable holds its kernels in
        a few hundred memory maps until it is freed (~340 each for the default model's
        steps), and a process gets vm.max_map_count of them (65,530 by default): past that,
        XLA's next compile or load fails to map memory and the process crashes. A shut-down
        engine's objects can sit in reference cycles until a full garbage collection."""
        self._model.clear()
        self._sampler.clear()
        self._mask.clear()

    def model_for(self, shape: StepShape):
        if shape not in self._model:  # only when compile_all was skipped (tests, tools)
            logger.warning("compiling %s during serving", shape)
            self._model[shape] = self._compile_model(shape)
        return self._model[shape]

    def sampler_for(self, rows: int, history: int):
        if (rows, history) not in self._sampler:
            logger.warning("compiling sampler %s during serving", (rows, history))
            self._sampler[rows, history] = self._compile_sampler(rows, history)
        return self._sampler[rows, history]

    def mask_for(self, rows: int):
        if rows not in self._mask:
            logger.warning("compiling grammar mask %d during serving", rows)
            self._mask[rows] = self._compile_mask(rows)
        return self._mask[rows]
