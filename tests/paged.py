"""Test driver for the model forward over the paged cache: jitted step, naive page handout."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tgix.attention.contract import METADATA_FIELDS, AttentionMetadata
from tgix.attention.pack import RowInput
from tgix.engine.kv_cache import init_kv_pages


class PagedDriver:
    """Runs requests through one model step at a time; each request owns pages it is handed."""

    def __init__(
        self, model, cfg, mesh, *, page_size=4, num_pages=64, pages_per_row=16, kv_dtype=None
    ):
        self.cfg, self.page_size, self.pages_per_row = cfg, page_size, pages_per_row
        self.attention = model.attention
        dtype = {} if kv_dtype is None else {"dtype": kv_dtype}
        self.kv = init_kv_pages(
            cfg, num_pages, page_size, mesh=mesh, attention=self.attention, **dtype
        )
        self.free = list(range(num_pages - 1, 0, -1))  # page 0 is the null page
        self.pages: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}
        graphdef, state = nnx.split(model)
        self.state = state

        @functools.partial(jax.jit, donate_argnums=(2,), static_argnames=("fresh_rows",))
        def step(state, token_ids, kv, md, logits_indices, fresh_rows):
            model = nnx.merge(graphdef, state)
            return model(token_ids, kv, md, logits_indices, fresh_rows=fresh_rows)

        self._step = step

    def _grow(self, request: str, new_len: int) -> list[int]:
        pages = self.pages.setdefault(request, [])
        while len(pages) * self.page_size < new_len:
            pages.append(self.free.pop())
        return pages

    def step(
        self, chunks: dict[str, Sequence[int]], *, num_tokens=None, num_rows=None, all_logits=False
    ) -> dict[str, np.ndarray]:
        """Feed each request its new tokens; returns per request logits [n, V] (all_logits) or
        the last token's logits [V]."""
        rows = []
        for request, ids in chunks.items():
            start = self.lengths.get(request, 0)
            rows.append(RowInput(list(ids), start, list(self._grow(request, start + len(ids)))))
            self.lengths[request] = start + len(ids)
        total = sum(len(r.token_ids) for r in rows)
        arrays = self.attention.pack(
            rows,
            page_size=self.page_size,
            num_tokens=num_tokens or total,
            num_rows=num_rows or len(rows),
            pages_per_row=self.pages_per_row,
        )
        md = AttentionMetadata(**{k: jnp.asarray(arrays[k]) for k in METADATA_FIELDS})
        indices = None if all_logits else jnp.asarray(arrays["logits_indices"])
        fresh = all(row.start_pos == 0 for row in rows)  # page-free prefill attention
        logits, self.kv = self._step(
            self.state, jnp.asarray(arrays["token_ids"]), self.kv, md, indices, fresh_rows=fresh
        )
        logits = np.asarray(logits)
        out = {}
        for i, (request, row) in enumerate(zip(chunks, rows, strict=True)):
            start = int(arrays["cu_q_lens"][i])
            out[request] = logits[start : start + len(row.token_ids)] if all_logits else logits[i]
        return out

    def release(self, request: str) -> None:
        self.free.extend(self.pages.pop(request, []))
        self.lengths.pop(request, None)


def greedy(driver: PagedDriver, prompt: Sequence[int], max_new_tokens: int, *, bucket=64):
    """Greedy continuation: one prefill (padded to `bucket` tokens), then one-token steps."""
    ids = list(prompt)
    nxt = int(np.argmax(driver.step({"g": ids}, num_tokens=bucket)["g"]))
    out = [nxt]
    for _ in range(max_new_tokens - 1):
        nxt = int(np.argmax(driver.step({"g": [nxt]})["g"]))
        out.append(nxt)
    driver.release("g")
    return out


def prompt_then_tokens(loaded, prompt, continuation, *, num_tokens=24, num_pages=24):
    """Logits [len(prompt) + len(continuation), V] of a model (tgix.models.LoadedModel): the
    prompt in one step padded to `num_tokens`, then one token per step; every page returns."""
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=num_pages)
    out = [driver.step({"r": list(prompt)}, num_tokens=num_tokens, all_logits=True)["r"]]
    out += [driver.step({"r": [t]})["r"][None] for t in continuation]
    driver.release("r")
    assert len(driver.free) == num_pages - 1
    return np.concatenate(out)
