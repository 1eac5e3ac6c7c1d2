"""A deterministic stand-in for tgix's Engine, so the HTTP layer is tested without a model.

Tokenizer: one token per character (id = code point + 10), BOS `<s>` = 1 and EOS `</s>` = 2,
a tiny chat template (`<|role|>content\\n` ..., then `<|assistant|>`).
Generation: the engine echoes the prompt's characters (special tokens dropped), then EOS;
`max_new_tokens` ends it with "length", a stop string in the decoded text with
"stop_sequence". Every logprob is float32(-1.53); top tokens are the token and its id
neighbours. Knobs: `token_delay` / `first_token_delay` (slow mode), `fail_after` (a
GenerationError after n tokens), `incomplete` (end without a Completion), `healthy_flag`,
`replies` (scripted answers, one per request in submission order: a string is one token per
character, a list of strings one token per piece; EOS follows).
Grammar: `grammar_compiler` is a FakeCompiler (tests/server/fake_grammar.py), so grammars are
"compiled" but never enforced: the scripted reply is what the model says.
Every submitted request, cancellation and shutdown is recorded for assertions.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.server.fake_grammar import FakeCompiler
from tgix.engine.request import (
    Completion,
    EngineLimits,
    GenerationError,
    GenerationRequest,
    TokenEvent,
    TokenInfo,
)

BOS, EOS = 1, 2
SPECIAL = {BOS: "<s>", EOS: "</s>"}
LOGPROB = struct.unpack("f", struct.pack("f", -1.53))[0]  # -1.5299999713897705
_END = object()


PIECE_BASE = 0x110000 + 10  # ids above every character's: multi-character scripted tokens
VOCAB_SIZE = PIECE_BASE + 1000
_PIECES: dict[int, str] = {}
_PIECE_IDS: dict[str, int] = {}


def token_id(ch: str) -> int:
    return ord(ch) + 10


def piece_id(piece: str) -> int:
    """A token id whose text is `piece` (registered on first use)."""
    if piece not in _PIECE_IDS:
        _PIECE_IDS[piece] = PIECE_BASE + len(_PIECE_IDS)
        _PIECES[_PIECE_IDS[piece]] = piece
    return _PIECE_IDS[piece]


def token_text(i: int) -> str:
    if i >= PIECE_BASE:
        return _PIECES[i]
    return SPECIAL.get(i) or (chr(i - 10) if i >= 10 else f"<unused{i}>")


class FakeHF:
    """The bits of a transformers fast tokenizer /tokenize uses."""

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping=False):
        ids = ([BOS] if add_special_tokens else []) + [token_id(c) for c in text]
        offsets = ([(0, 0)] if add_special_tokens else []) + [(i, i + 1) for i in range(len(text))]
        return {"input_ids": ids, "offset_mapping": offsets}


class FakeTokenizer:
    def __init__(self, chat_template: str | None = "fake"):
        self.chat_template = chat_template
        self.eos_token_ids = (EOS,)
        self.hf = FakeHF()
        self.encode_calls: list[str] = []
        self.encode_threads: set[str] = set()
        self.template_tools: list | None = None  # `tools` given to the last rendering

    def __deepcopy__(self, memo):
        """Stateless enough to share: the validator's per-thread copies are this object, so
        tests can see every call."""
        return self

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encode_calls.append(text)
        self.encode_threads.add(threading.current_thread().name)
        return ([BOS] if add_special_tokens else []) + [token_id(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        keep = [i for i in ids if not (skip_special_tokens and i in SPECIAL)]
        return "".join(token_text(i) for i in keep)

    def apply_chat_template(
        self, messages, *, add_generation_prompt=True, tools=None, continue_final_message=False
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        self.template_tools = tools
        for m in messages:
            if "RAISE" in m["content"]:
                raise RuntimeError("Conversation roles must alternate")  # like raise_exception()
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        if continue_final_message:
            return text[:-1]
        return text + ("<|assistant|>" if add_generation_prompt else "")


@dataclass
class Knobs:
    token_delay: float = 0.0
    first_token_delay: float = 0.0
    fail_after: int | None = None
    incomplete: bool = False
    late_completion: bool = False  # break the delivery contract (Completion a loop turn later)
    replies: list[str | list[str]] = field(default_factory=list)


class FakeStream:
    def __init__(self, engine: FakeEngine, request_id: str):
        self.engine = engine
        self.request_id = request_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self._done = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, GenerationError):
            self._done = True
            raise item
        if isinstance(item, Completion):
            self._done = True
        return item

    def cancel(self) -> None:
        self.engine.cancel(self.request_id)


def _info(i: int, logprob: float | None = LOGPROB) -> TokenInfo:
    return TokenInfo(id=i, text=token_text(i), logprob=logprob, special=i in SPECIAL)


def roomy_limits() -> EngineLimits:
    """Limits with room for tool prompts (tools as JSON plus TGI's tool prompt)."""
    return EngineLimits(
        max_input_tokens=3000,
        max_total_tokens=4000,
        max_batch_prefill_tokens=4096,
        max_batch_total_tokens=16384,
        max_batch_size=None,
        max_waiting_tokens=20,
        waiting_served_ratio=0.3,
        page_size=16,
        chunked_prefill=True,
    )


class FakeEngine:
    def __init__(self, limits: EngineLimits | None = None, *, chat_template: str | None = "fake"):
        self.tokenizer = FakeTokenizer(chat_template)
        self.limits = limits or EngineLimits(
            max_input_tokens=200,
            max_total_tokens=256,
            max_batch_prefill_tokens=512,
            max_batch_total_tokens=4096,
            max_batch_size=None,
            max_waiting_tokens=20,
            waiting_served_ratio=0.3,
            page_size=16,
            chunked_prefill=True,
        )
        self.model_id = "fake/echo"
        self.pipeline_tag: str | None = "text-generation"
        self.grammar_compiler: FakeCompiler | None = FakeCompiler()
        self.knobs = Knobs()
        self.healthy_flag = True
        self.submitted: list[GenerationRequest] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.shutdown_calls = 0
        self._active: dict[str, tuple[FakeStream, asyncio.Task]] = {}
        self._ids = itertools.count(1)

    # --- the Engine interface -------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> FakeStream:
        if self.shutdown_calls:
            raise GenerationError("the engine is shut down", "shutdown")
        request_id = request.request_id or f"req-{next(self._ids)}"
        self.submitted.append(request)
        stream = FakeStream(self, request_id)
        task = asyncio.get_running_loop().create_task(self._run(stream, request))
        self._active[request_id] = (stream, task)
        return stream

    def cancel(self, request_id: str) -> None:
        entry = self._active.pop(request_id, None)
        if entry is not None:
            self.cancelled.append(request_id)
            entry[1].cancel()

    def healthy(self) -> bool:
        return self.healthy_flag

    def stats(self) -> dict[str, float]:
        return {
            "queue_size": 0.0,
            "batch_size": float(len(self._active)),
            "batch_max_tokens": 0.0,
            "free_pages": 100.0,
            "used_pages": 0.0,
        }

    def shutdown(self) -> None:
        self.shutdown_calls += 1

    # --- test helpers ---------------------------------------------------------------------
    @property
    def active(self) -> list[str]:
        return list(self._active)

    def reset(self) -> None:
        self.knobs = Knobs()
        if self.grammar_compiler is not None:
            self.grammar_compiler.reset()
        self.healthy_flag = True
        self.submitted.clear()
        self.cancelled.clear()
        self.finished.clear()

    # --- generation -----------------------------------------------------------------------
    def _plan(self, request: GenerationRequest) -> tuple[list[int], str, str | None]:
        source = [i for i in request.prompt_ids if i not in SPECIAL] or [token_id("?")]
        if self.knobs.replies:
            reply = self.knobs.replies.pop(0)
            source = [piece_id(p) if len(p) > 1 else token_id(p) for p in reply]
        out: list[int] = []
        for i in itertools.cycle(source + ([] if request.ignore_eos else [EOS])):
            out.append(i)
            text = self.tokenizer.decode(out, skip_special_tokens=True)
            stop = next((s for s in request.stop if s and s in text), None)
            if len(out) >= request.max_new_tokens:
                return out, "length", None
            if i == EOS:
                return out, "eos_token", None
            if stop is not None:
                return out, "stop_sequence", stop
        raise AssertionError("unreachable")

    def _completion(self, request, ids, reason, stop) -> Completion:
        n = request.top_n_tokens
        top = tuple(tuple(_info(i + k) for k in range(n)) for i in ids) if n else ()
        prefill, prefill_top = (), ()
        if request.prompt_logprobs:
            prefill = tuple(
                _info(i, None if k == 0 else LOGPROB) for k, i in enumerate(request.prompt_ids)
            )
            if n:  # alternatives i + 1, i + 2, ... after the (unscored) first prompt token
                alternatives = [
                    tuple(_info(i + k) for k in range(1, n + 1)) for i in request.prompt_ids
                ]
                prefill_top = ((), *alternatives[1:])
        sampling = request.sampling
        seed = (
            (sampling.seed if sampling.seed is not None else 42) if sampling.is_sampling else None
        )
        kwargs: dict[str, Any] = dict(
            generated_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=reason,
            generated_tokens=len(ids),
            seed=seed,
            input_length=len(request.prompt_ids),
            tokens=tuple(_info(i) for i in ids),
            prefill=prefill,
            prefill_top_tokens=prefill_top,
            top_tokens=top,
            stop_sequence=stop,
            queue_time=0.001,
            inference_time=0.002,
        )
        others = tuple(Completion(**kwargs) for _ in range(request.best_of - 1))
        return Completion(**kwargs, best_of_sequences=others)

    async def _run(self, stream: FakeStream, request: GenerationRequest) -> None:
        knobs, q = self.knobs, stream.queue
        try:
            ids, reason, stop = self._plan(request)
            await asyncio.sleep(knobs.first_token_delay)
            for k, i in enumerate(ids, start=1):
                await asyncio.sleep(knobs.token_delay)
                if knobs.fail_after is not None and k > knobs.fail_after:
                    q.put_nowait(GenerationError("Server error: injected failure"))
                    return
                top = tuple(_info(i + j) for j in range(request.top_n_tokens))
                q.put_nowait(TokenEvent(index=k, token=_info(i), top_tokens=top))
            if knobs.incomplete:
                q.put_nowait(_END)
                return
            if knobs.late_completion:
                await asyncio.sleep(0.05)
            q.put_nowait(self._completion(request, ids, reason, stop))
            self.finished.append(stream.request_id)
        except Exception as exc:  # a broken fake must fail the request, not hang it
            q.put_nowait(GenerationError(f"fake engine bug: {exc!r}"))
        finally:
            self._active.pop(stream.request_id, None)
