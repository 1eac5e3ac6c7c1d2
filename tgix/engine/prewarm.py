"""Run each compiled step once while the engine is idle, before a request needs it.

On XLA:CPU the first call of an executable is slow: its YNNPACK fusions set themselves up
(measured with the default model: a 64-token prompt step 265 ms the first time and 63 ms
after; a batch-4 decode step 171 ms and 23 ms; with YNNPACK fusions off there is no first-
call cost but every call is 2-3x slower). Compiling ahead of time does not pay it, so the
first request of each step shape did: ~0.2 s more time to first token, once per shape, and
short benchmark levels measured it. The engine calls `step()` when it has nothing to do;
each call runs one not-yet-run executable on rows whose pages are all the null page 0
(every K/V write lands there, so no state changes; the outputs are discarded), once per
attention branch, and returns. Shapes cheap enough to run
without delaying a request that arrives meanwhile go first, smallest first: fresh and
mixed steps up to `max_tokens` tokens, every decode step, every sampler and grammar mask.
Bigger prompt steps pay their first-call cost on first use, where it is a smaller share.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tgix.attention.contract import METADATA_FIELDS
from tgix.attention.pack import RowInput
from tgix.attention.xla import SHORT_ROW
from tgix.engine.buckets import StepShape
from tgix.engine.request import SamplingParams
from tgix.engine.sampling import SamplingArrays
from tgix.engine.sampling_host import pack_sampling

logger = logging.getLogger(__name__)
MAX_TOKENS = 512  # largest prompt step warmed (~0.3 s of compute on the default model)
EVERY_STAGE = SamplingParams(
    do_sample=True,
    temperature=0.7,
    top_k=5,
    top_p=0.9,
    typical_p=0.9,
    repetition_penalty=1.1,
    frequency_penalty=0.1,
    presence_penalty=0.1,
    seed=1,
    watermark=True,
)


class Prewarmer:
    """Warms `runner`'s executables one per `step()` call; `done` when all are warm."""

    def __init__(self, runner, max_tokens: int = MAX_TOKENS):
        self.runner = runner
        buckets = runner.config.buckets
        shapes = [s for s in buckets.model_shapes() if s.num_tokens <= max_tokens]
        shapes.sort(key=lambda s: (s.num_tokens, s.num_rows))
        samplers = buckets.sampler_shapes()
        masks = sorted({r for r, _ in samplers})
        self._todo = [("model", s) for s in shapes]
        self._todo += [("sampler", s) for s in samplers] + [("mask", r) for r in masks]
        self._todo.reverse()  # pop() from the end: smallest first
        self._ran, self._seconds = 0, 0.0

    @property
    def done(self) -> bool:
        return not self._todo

    def step(self) -> bool:
        """Run the next executable not yet run (by serving or by an earlier call); False when
        nothing is left."""
        while self._todo:
            # popped only once it ran, so `done` (read by other threads) is never true
            # while the last warm-up is still running
            item = self._todo[-1]
            if item in self.runner.ran:
                self._todo.pop()
                continue
            start = time.perf_counter()
            _RUNS[item[0]](self.runner, item[1])
            self.runner.ran.add(item)
            self._todo.pop()
            self._ran, self._seconds = self._ran + 1, self._seconds + time.perf_counter() - start
            if not self._todo:
                logger.info("prewarmed %d executables in %.1f s", self._ran, self._seconds)
            return True
        return False


def _model(runner, shape: StepShape) -> None:
    """Run the step on rows that take its attention branches (32- and 256-token prompt
    blocks; decode rows' per-token pass, a continuing chunk's per-row pass): kernels inside
    a loop or branch that never runs stay cold."""
    t, page = shape.num_tokens, runner.config.page_size
    row = lambda n, start: RowInput([0] * n, start, [0] * -(-(start + n) // page))  # page 0 only
    if shape.fresh:
        steps = [[row(min(t, SHORT_ROW), 0)]] + ([[row(t, 0)]] if t > SHORT_ROW else [])
    else:
        cap = shape.pages_per_row * page  # tokens a row can hold
        decode = row(1, min(64, cap - 1))
        if t == shape.num_rows:
            steps = [[decode] * t]
        else:  # a decode row, then a prompt chunk continuing after a few cached tokens
            start = min(16, cap // 2)
            longest = min(t - 1, cap - start)
            chunks = [min(longest, SHORT_ROW)] + ([longest] if longest > SHORT_ROW else [])
            steps = [[decode, row(n, start)] for n in chunks]
    for rows in steps:
        packed = runner.attention.pack(
            rows,
            page_size=page,
            num_tokens=t,
            num_rows=shape.num_rows,
            pages_per_row=shape.pages_per_row,
        )
        metadata = {k: packed[k] for k in METADATA_FIELDS}
        indices = shape.logits_indices(packed["logits_indices"])
        extras = {}
        if shape.images:  # nothing marked: the token embeddings stand
            extras["image_embeds"] = np.zeros((t, runner.cfg.hidden_size), np.float32)
            extras["image_marks"] = np.zeros(t, np.bool_)
        if runner.cfg.mrope_section:
            extras["rope_positions"] = np.stack([packed["positions"]] * 3)
        logits, *_ = runner.call_model(shape, packed["token_ids"], metadata, indices, extras)
        logits.block_until_ready()


def _sampler(runner, key: tuple[int, int]) -> None:
    """Greedy rows, then rows with every warper and penalty on (each stage is a branch)."""
    rows, history = key
    logits = np.zeros((rows, runner.cfg.vocab_size), np.float32)
    for params in ([], [EVERY_STAGE] * rows):
        out = runner.executables.sampler_for(rows, history)(
            logits,
            SamplingArrays(**pack_sampling(params, rows)),
            np.zeros(rows, np.int32),
            np.zeros((rows, history), np.int32),
        )
        out[0].block_until_ready()


def _mask(runner, rows: int) -> None:
    words = -(-runner.cfg.vocab_size // 32)
    logits = np.zeros((rows, runner.cfg.vocab_size), np.float32)
    allowed = np.full((rows, words), 0xFFFFFFFF, np.uint32)
    runner.executables.mask_for(rows)(logits, allowed).block_until_ready()


_RUNS = {"model": _model, "sampler": _sampler, "mask": _mask}
