"""The constrained-decoding engines `benchmarks.grammar` compares, each in its own worker
process: tgix's `GrammarCompiler` (inline, no cache, lazy or eager), outlines-core's `Index` /
`Guide` and llguidance's `LLMatcher` (`benchmarks.grammar_llg`).

A worker gets the vocabulary once at start, then one schema at a time: it compiles it (timed),
writes the start state's mask into its buffer (timed: first mask = compile + that fill),
reports, then replays the instances (token ids from the parent, one list per candidate text)
and reports which were accepted and the per-token "mask + advance" times of the valid ones,
then replays the valid instances' walks once more (states now built) for a second set of
times. The parent (`Worker`) waits with a deadline and kills a worker that overruns it
(outlines-core and llguidance have no time budget of its own; tgix's `timeout_s` should fire
first), then starts a fresh one for the next schema. Workers cap their address space so a
runaway compile fails alone.

Kept free of JAX imports: spawned workers import this module and nothing heavier.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time

import numpy as np

MEMORY_CAP_BYTES = 8 << 30
_READY_TIMEOUT_S = 300.0


def gpt2_token_bytes(piece: str) -> bytes:
    """A byte-level BPE piece back to bytes: GPT-2 spells the 188 printable bytes as
    themselves and the other 68 as U+0100, U+0101, ... in byte order."""
    return bytes(_gpt2_inverse()[c] for c in piece)


_INVERSE: dict[str, int] = {}


def _gpt2_inverse() -> dict[str, int]:
    if not _INVERSE:
        kept = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
        shifted = (b for b in range(256) if b not in kept)
        _INVERSE.update({chr(b): b for b in kept})
        _INVERSE.update({chr(0x100 + i): b for i, b in enumerate(shifted)})
    return _INVERSE


def outlines_token_map(hf) -> dict[bytes, list[int]]:
    """outlines-core's `Vocabulary` input for a byte-level BPE tokenizer: raw token bytes ->
    ids. Special tokens (EOS among them) are left out, as tgix leaves them out."""
    special = set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}
    out: dict[bytes, list[int]] = {}
    for i, piece in enumerate(hf.convert_ids_to_tokens(list(range(len(hf))))):
        if i not in special and piece:
            out.setdefault(gpt2_token_bytes(piece), []).append(i)
    return out


# -- engines, inside the worker ------------------------------------------------------------------


class _Tgix:
    def __init__(self, vocab, timeout_s: float, lazy: bool):
        from tgix.grammar import GrammarCompiler, GrammarOptions

        options = GrammarOptions(timeout_s=timeout_s)
        self.compiler = GrammarCompiler(vocab, options, workers=0, memory_items=0, lazy=lazy)
        self.compiler.warm_up()  # builds the vocabulary trie once, outside any timing
        self.eos = vocab.eos_ids[0]
        self.buf = np.zeros(-(-vocab.size // 32), dtype=np.uint32)

    def compile(self, schema_text: str):
        from tgix.grammar import GrammarSpec

        index = self.compiler.compile(GrammarSpec.json(schema_text))
        stats = {k: index.stats.get(k) for k in ("dfa_states", "token_states")}
        return index, stats

    def first_mask(self, index) -> None:
        np.copyto(self.buf, index.mask(index.start))

    def walk(self, index, ids: list[int]) -> tuple[bool, list[int]]:
        from tgix.grammar import GrammarError

        buf, times, state = self.buf, [], index.start
        clock = time.perf_counter_ns
        for t in ids:
            t0 = clock()
            try:  # a lazy grammar builds masks here: its budget can end the walk too
                np.copyto(buf, index.mask(state))
                state = index.advance(state, t)
            except GrammarError:
                return False, times
            times.append(clock() - t0)
        try:
            return index.allows(state, self.eos), times
        except GrammarError:
            return False, times


class _Outlines:
    def __init__(self, token_map: dict[bytes, list[int]], eos: int, size: int):
        from outlines_core import Vocabulary

        self.vocab = Vocabulary(eos, token_map)
        self.eos = eos
        self.buf = np.zeros(-(-size // 32), dtype=np.int32)

    def compile(self, schema_text: str):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(schema_text)
        index = Index(regex, self.vocab)
        return index, {"regex_chars": len(regex)}

    def first_mask(self, index) -> None:
        from outlines_core import Guide

        Guide(index).write_mask_into(self.buf.ctypes.data, self.buf.size, 4)

    def walk(self, index, ids: list[int]) -> tuple[bool, list[int]]:
        from outlines_core import Guide

        guide, buf, times = Guide(index), self.buf, []
        ptr, numel, clock = buf.ctypes.data, buf.size, time.perf_counter_ns
        for t in ids:
            t0 = clock()
            guide.write_mask_into(ptr, numel, 4)
            try:
                guide.advance(t, return_tokens=False)
            except ValueError:
                return False, times
            times.append(clock() - t0)
        guide.write_mask_into(ptr, numel, 4)
        return bool((int(buf[self.eos // 32]) >> (self.eos % 32)) & 1), times


def _engine(kind: str, args: tuple):
    if kind == "tgix":
        return _Tgix(*args)
    if kind == "outlines":
        return _Outlines(*args)
    from benchmarks.grammar_llg import LLGuidance

    return LLGuidance(*args)


def _serve(kind: str, args: tuple, conn) -> None:
    """Worker main loop: ("ready") once, then per schema ("compiled", ...), ("tested", ...)."""
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    engine = _engine(kind, args)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    conn.send(("ready",))
    while (job := conn.recv()) is not None:
        schema_text, tests = job
        t0 = time.perf_counter()
        compile_s = first_s = None
        try:
            index, stats = engine.compile(schema_text)
            compile_s = time.perf_counter() - t0
            engine.first_mask(index)
            first_s = time.perf_counter() - t0
        except Exception as exc:  # the engine's refusal: reported, not fatal
            spent = time.perf_counter() - t0 if compile_s is None else compile_s
            conn.send(("compiled", spent, None, f"{type(exc).__name__}: {exc}", {}))
            continue
        conn.send(("compiled", compile_s, first_s, None, stats))
        accepted, times, walks = [], [], []
        for valid, texts in tests:
            ok = False
            for ids in texts:
                ok, walked = engine.walk(index, ids)
                if valid:
                    times.extend(walked)
                    walks.append(ids)
                if ok:
                    break
            accepted.append(ok)
        again = [t for ids in walks for t in engine.walk(index, ids)[1]]  # states built now
        conn.send(("tested", accepted, _ns(times), _ns(again)))


def _ns(times: list[int]) -> np.ndarray:
    return np.asarray(times, dtype=np.int64)


# -- parent side ----------------------------------------------------------------------------------


class Worker:
    """One engine's worker process, restarted after a timeout or a crash."""

    def __init__(
        self, kind: str, args: tuple, compile_limit_s: float, test_limit_s: float, name=None
    ):
        self.kind, self.args, self.name = kind, args, name or kind
        self.compile_limit_s, self.test_limit_s = compile_limit_s, test_limit_s
        self.proc = self.conn = None
        self.restarts, self.reason = 0, ""

    def run(self, schema_text: str, tests: list) -> dict:
        """{status: ok|error|timeout|crash|test_timeout|test_crash, compile_s, first_mask_s
        (compile + the start state's mask; None unless compiled), error, stats, accepted (one
        bool per test), times and times_again (ns per token of the valid instances, first and
        second replay)}."""
        if self.proc is None:
            self._start()
        t0 = time.perf_counter()
        self.conn.send((schema_text, tests))
        out = {"status": "ok", "error": None, "stats": {}, "accepted": [], "first_mask_s": None}
        out["times"] = out["times_again"] = None
        msg = self._recv(self.compile_limit_s)
        if msg is None:
            reason = self._lost()
            out.update(status=reason.split()[0], error=f"{self.name} worker {reason}")
            out["compile_s"] = time.perf_counter() - t0
            return out
        _, out["compile_s"], out["first_mask_s"], out["error"], out["stats"] = msg
        if out["error"] is not None:
            out["status"] = "error"
            return out
        msg = self._recv(self.test_limit_s)
        if msg is None:
            reason = self._lost()
            out.update(status="test_" + reason.split()[0], error=f"{self.name} worker {reason}")
            return out
        _, out["accepted"], out["times"], out["times_again"] = msg
        return out

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.proc.join(5)
            self._kill()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(self.kind, self.args, child), daemon=True)
        self.proc.start()
        child.close()
        if self._recv(_READY_TIMEOUT_S) is None:
            raise RuntimeError(f"{self.name} benchmark worker did not start")

    def _recv(self, limit_s: float):
        """The worker's next message, or None (self.reason says why) past the limit or if
        the worker died."""
        try:
            if self.conn.poll(limit_s):
                return self.conn.recv()
            self.reason = "timeout"
        except (EOFError, OSError):
            self.reason = "crash"
        return None

    def _lost(self) -> str:
        """Kill the worker (a fresh one starts with the next schema); 'timeout' or 'crash
        (exit code N)'."""
        reason = self.reason
        if reason == "crash":
            self.proc.join(1)
            reason = f"crash (exit code {self.proc.exitcode})"
        self._kill()
        self.restarts += 1
        return reason

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join()
            self.conn.close()
        self.proc = self.conn = None


def make_workers(args, tok, names: list[str]) -> dict[str, Worker]:
    """One worker per engine name (`tgix`: lazy, `tgix-eager`, `outlines-core`, `llguidance`)
    for `benchmarks.grammar`'s args and tokenizer."""
    from benchmarks.grammar_llg import tokenizer_json
    from tgix.grammar.vocabulary import TokenVocabulary

    grace = args.timeout * 0.5 + 10  # tgix stops itself at --timeout; this is a backstop
    workers = {}
    if {"tgix", "tgix-eager"} & set(names):
        vocab = TokenVocabulary.from_tokenizer(tok.hf, eos_ids=tok.eos_token_ids)
    for name in names:
        if name.startswith("tgix"):
            engine = ("tgix", (vocab, args.timeout, name == "tgix"), args.timeout + grace)
        elif name == "outlines-core":
            peer = (outlines_token_map(tok.hf), tok.eos_token_ids[0], len(tok.hf))
            engine = ("outlines", peer, args.timeout)
        else:
            eos = list(tok.eos_token_ids)
            peer = (tokenizer_json(tok.hf), len(tok.hf), eos, args.llg_whitespace)
            engine = ("llguidance", peer, args.timeout)
        kind, init, limit = engine
        workers[name] = Worker(kind, init, limit, 600, name=name)
    return workers
