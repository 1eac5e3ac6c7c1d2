"""Compiling grammars off the engine thread, with caches.

Compiles run in worker processes (spawned: no fork of a process holding JAX threads), so a
slow schema never holds the GIL the engine loop needs; each worker builds the vocabulary trie
once at start. Results are cached in memory (LRU) and on disk (`.npz` under
$TGIX_CACHE/grammars), keyed by the spec, the options and the vocabulary's content hash.
Concurrent requests for the same grammar share one compile. `workers=0` compiles inline in
the caller's thread (tests, benchmarks).

Lazy (`lazy=True`, the engine's choice): a grammar not in a cache is built lazily
(tgix.grammar.lazy_index) in one thread of this process, usable once its start state's mask
is ready; masks of later states are built when generation reaches them. The eager compile
still runs in the worker processes (at a lower CPU priority: it is background work), and when
it succeeds its index (and the disk cache entry) takes over for later requests; requests
already running keep the lazy one.

Two lanes of `workers` processes each: specs up to SMALL_SPEC_CHARS (a regex, a short schema)
and larger ones, so a burst of expensive grammars (six 10,000-value enums took 39 s) never
queues a one-line regex behind it. Each lane holds at most QUEUE_LIMIT compiles, queued or
running; past that a compile fails at once with GrammarBusy (the server's 429).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import threading
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from tgix.grammar.errors import GrammarError
from tgix.grammar.index import TokenIndex
from tgix.grammar.options import GrammarOptions
from tgix.grammar.pipeline import CompiledArrays, compile_arrays, compile_lazy
from tgix.grammar.spec import GrammarSpec
from tgix.grammar.token_trie import Trie, build_byte_trie
from tgix.grammar.vocabulary import TokenVocabulary

logger = logging.getLogger(__name__)
_WORKER_MEMORY_BYTES = 8 << 30  # address-space cap per worker: a runaway compile fails alone
SMALL_SPEC_CHARS = 2048  # specs up to this size compile in the small lane
QUEUE_LIMIT = 32  # compiles queued or running per lane
# Lazy mode's eager compiles only replace an index that already works: they yield the CPU
# to the engine (on 2 cores one at normal priority slowed a new schema's first token).
BACKGROUND_NICENESS = 10


class GrammarBusy(GrammarError):
    """The compile queue is full: retry later (not the grammar's fault)."""


class GrammarCompiler:
    def __init__(
        self,
        vocab: TokenVocabulary,
        options: GrammarOptions | None = None,
        *,
        workers: int = 1,
        cache_dir: str | os.PathLike | None = None,
        memory_items: int = 64,
        lazy: bool = False,
    ):
        self.vocab, self.workers, self.lazy = vocab, workers, lazy
        self.options = options or GrammarOptions()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._digest = vocab.digest()
        self._lru: OrderedDict[str, TokenIndex] = OrderedDict()
        self._memory_items = memory_items
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pools: dict[str, ProcessPoolExecutor | None] = {"small": None, "large": None}
        self._queued = {"small": 0, "large": 0}
        self._trie: Trie | None = None
        self._lazy_pool: ThreadPoolExecutor | None = None

    @classmethod
    def for_tokenizer(
        cls, tokenizer, *, eos_ids=(), size: int | None = None, **kwargs
    ) -> GrammarCompiler:
        """tokenizer: a transformers fast tokenizer or tgix.tokenizer.Tokenizer; size: the
        model's logit width when larger than the tokenizer (padding ids are masked)."""
        own = getattr(tokenizer, "eos_token_ids", ())  # tgix.tokenizer.Tokenizer's EOS ids
        eos_ids = tuple(eos_ids) or (tuple(own) if isinstance(own, tuple | list) else ())
        vocab = TokenVocabulary.from_tokenizer(tokenizer, eos_ids=eos_ids, size=size)
        return cls(vocab, **kwargs)

    def key(self, spec: GrammarSpec) -> str:
        text = json.dumps([spec.key(), self.options.key(), self._digest])
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the TokenIndex (GrammarError on failure)."""
        key = self.key(spec)
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                done: Future = Future()
                done.set_result(self._lru[key])
                return done
            if key in self._pending:
                return self._pending[key]
            result: Future = Future()
            self._pending[key] = result
        cached = self._load(key)
        if cached is not None:
            self._finish(key, result, cached)
        elif self.lazy:
            self._submit_lazy(spec, key, result)
        elif self.workers == 0:
            try:
                arrays = compile_arrays(spec, self.vocab, self._byte_trie(), self.options)
                self._finish(key, result, arrays)
            except BaseException as exc:  # delivered through the future
                self._fail(key, result, exc)
        else:
            self._submit_to_pool(spec, key, result)
        return result

    def compile(self, spec: GrammarSpec) -> TokenIndex:
        return self.submit(spec).result()

    async def compile_async(self, spec: GrammarSpec) -> TokenIndex:
        return await asyncio.wrap_future(self.submit(spec))

    def warm_up(self) -> None:
        """Start the workers (and their trie) now rather than on the first request; lazily,
        also build this process's trie and the container automaton of unconstrained values."""
        self.compile(GrammarSpec.regex("[0-9]"))
        if self.lazy:
            self.compile(GrammarSpec.json({"type": "object"}))

    def close(self) -> None:
        if self._lazy_pool is not None:
            self._lazy_pool.shutdown(wait=False, cancel_futures=True)
        for lane, pool in self._pools.items():
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
                self._pools[lane] = None

    # -- internals ---------------------------------------------------------------------------

    def _byte_trie(self) -> Trie:
        if self._trie is None:
            self._trie = build_byte_trie(self.vocab.token_bytes)
        return self._trie

    def _submit_lazy(self, spec: GrammarSpec, key: str, result: Future) -> None:
        def build() -> None:
            try:
                index = compile_lazy(spec, self.vocab, self._byte_trie(), self.options)
            except BaseException as exc:  # delivered through the future
                self._fail(key, result, exc)
                return
            self._remember(key, index)
            result.set_result(index)
            if self.workers > 0:  # the eager compile takes over when it finishes
                self._submit_to_pool(spec, key, Future(), quiet=True)

        if self.workers == 0:
            build()
            return
        with self._lock:
            if self._lazy_pool is None:
                self._lazy_pool = ThreadPoolExecutor(1, thread_name_prefix="tgix-grammar")
        self._lazy_pool.submit(build)

    def _remember(self, key: str, index) -> None:
        with self._lock:
            self._lru[key] = index
            self._lru.move_to_end(key)
            while len(self._lru) > self._memory_items:
                self._lru.popitem(last=False)
            self._pending.pop(key, None)

    def _submit_to_pool(
        self, spec: GrammarSpec, key: str, result: Future, *, quiet: bool = False
    ) -> None:
        """quiet: a background eager compile behind a lazy index (a failure or a full queue
        only means the lazy index stays)."""
        lane = "small" if len(spec.value) <= SMALL_SPEC_CHARS else "large"
        with self._lock:
            if self._queued[lane] >= QUEUE_LIMIT:
                if quiet:
                    return
                busy = GrammarBusy(f"grammar compiler busy ({QUEUE_LIMIT} compiles queued)")
                self._pending.pop(key, None)
                result.set_exception(busy)
                return
            self._queued[lane] += 1
            pool = self._pools[lane]
            if pool is None:
                pool = self._pools[lane] = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_worker_init,
                    initargs=(self.vocab, BACKGROUND_NICENESS if self.lazy else 0),
                )

        def done(f: Future) -> None:
            with self._lock:
                self._queued[lane] -= 1
            exc = f.exception()
            if exc is None:
                self._finish(key, result, f.result())
                return
            if quiet:
                return
            if isinstance(exc, BrokenProcessPool):
                with self._lock:
                    if self._pools[lane] is pool:
                        self._pools[lane] = None
                exc = GrammarError("grammar compilation failed (compile worker died)")
            self._fail(key, result, exc)

        try:
            pool.submit(_worker_compile, spec, self.options).add_done_callback(done)
        except (BrokenProcessPool, RuntimeError):
            with self._lock:
                self._queued[lane] -= 1
                self._pools[lane] = None
            if quiet:
                return
            self._fail(key, result, GrammarError("grammar compiler is restarting, retry"))

    def _finish(self, key: str, result: Future, arrays: CompiledArrays) -> None:
        index = arrays.attach(self.vocab)
        self._save(key, arrays)
        self._remember(key, index)
        result.set_result(index)

    def _fail(self, key: str, result: Future, exc: BaseException) -> None:
        with self._lock:
            self._pending.pop(key, None)
        if not isinstance(exc, GrammarError):  # details in the log, never in a response
            logger.error("grammar compilation failed", exc_info=exc)
            exc = GrammarError("grammar compilation failed")
        result.set_exception(exc)

    def _path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{key}.npz"

    def _load(self, key: str) -> CompiledArrays | None:
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                stats = json.loads(str(z["stats"]))
                return CompiledArrays.from_arrays(z, stats)
        except Exception:  # a damaged cache entry is recompiled
            logger.warning("ignoring unreadable grammar cache entry %s", path)
            return None

    def _save(self, key: str, arrays: CompiledArrays) -> None:
        path = self._path(key)
        if path is None or path.exists():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(
                tmp,
                **arrays.arrays(),
                stats=np.array(json.dumps(arrays.stats, default=str)),
            )
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("cannot write grammar cache %s: %s", path, exc)


# -- worker process ------------------------------------------------------------------------------

_worker: dict = {}


def _worker_init(vocab: TokenVocabulary, niceness: int = 0) -> None:
    if niceness:
        with contextlib.suppress(OSError):
            os.nice(niceness)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server handles Ctrl-C
    _worker["vocab"] = vocab
    _worker["trie"] = build_byte_trie(vocab.token_bytes)


def _on_alarm(signum, frame):
    raise GrammarError("grammar compilation exceeded its time budget")


def _worker_compile(spec: GrammarSpec, options: GrammarOptions) -> CompiledArrays:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, options.timeout_s + 1.0)
    try:
        return compile_arrays(spec, _worker["vocab"], _worker["trie"], options)
    except MemoryError:
        raise GrammarError("grammar compilation ran out of memory") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
