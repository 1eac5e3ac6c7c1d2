"""Small pieces with sharp edges: float32 output, stop-sequence hold-back, the pairing of
the last token with its Completion, and serde-style field errors."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from server import errors
from server.engine_io import paired
from server.errors import ApiError, PlainError
from server.fields import Fields
from server.jsonio import dumps, f32
from server.openai_format import StopHoldback, visible_text
from tgix.engine.request import Completion, GenerationError, TokenEvent, TokenInfo


def as_f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@pytest.mark.parametrize("x", [-1.53, -0.1, -12.345678, -1e-7, 0.0, -3.4e38, -2.0 / 3.0])
def test_f32_is_shortest_round_trip(x):
    value = as_f32(x)
    short = f32(value)
    assert as_f32(short) == value
    assert len(repr(short)) <= len(repr(value))
    assert f32(float("nan")) is None and f32(float("-inf")) is None and f32(None) is None
    assert f32(-1e39) is None  # overflows float32, as serde would write an infinite f32
    assert dumps({"a": f32(as_f32(-1.53)), "t": "é\n"}) == '{"a":-1.53,"t":"é\\n"}'.encode()


def _completion(text: str, reason: str, stop: str | None = None) -> Completion:
    return Completion(
        generated_text=text,
        finish_reason=reason,
        generated_tokens=1,
        seed=None,
        input_length=1,
        tokens=(),
        stop_sequence=stop,
    )


def test_stop_holdback_never_leaks_a_stop_prefix():
    hold = StopHoldback(["END", "##"])
    out = [hold.push(p) for p in ["a", "b", "E", "N", "x", "#", "E", "N", "D", "zz"]]
    # "E", "EN" and "#" are held while they could start a stop; "#E" proves "#" is not "##"
    assert out == ["a", "b", "", "", "ENx", "", "#", "", "", ""]
    assert hold.finish(_completion("abENx#END", "stop_sequence", "END")) == ""
    assert "".join(out) == visible_text(_completion("abENx#ENDzz", "stop_sequence", "END"))

    hold = StopHoldback(["END"])
    assert [hold.push(p) for p in ["a", "EN"]] == ["a", ""]
    assert hold.finish(_completion("aEN", "length")) == "EN"  # not a stop after all: flushed
    assert StopHoldback([]).push("abc") == "abc"


class _Stream:
    """An engine stream whose items arrive on a schedule: (delay_s, item)."""

    def __init__(self, schedule):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

        async def feed():
            for delay, item in schedule:
                if delay:
                    await asyncio.sleep(delay)
                self.queue.put_nowait(item)

        self.task = asyncio.ensure_future(feed())

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is StopAsyncIteration:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self):
        self.cancelled = True


def _ev(i: int) -> TokenEvent:
    return TokenEvent(index=i, token=TokenInfo(id=i, text=str(i), logprob=-1.0, special=False))


def _run(schedule):
    async def go():
        out = []
        try:
            async for ev, final in paired(_Stream(schedule)):
                out.append((ev and ev.index, final and final.finish_reason))
        except ApiError as exc:
            out.append(exc.error_type)
        return out

    return asyncio.run(go())


def test_paired_attaches_the_completion_to_the_last_token():
    done = _completion("x", "length")
    assert _run([(0, _ev(1)), (0.01, _ev(2)), (0.01, _ev(3)), (0, done)]) == [
        (1, None),
        (2, None),
        (3, "length"),
    ]
    # tokens already queued together are not held back waiting for the next one
    assert _run([(0, _ev(1)), (0, _ev(2)), (0.01, done)]) == [
        (1, None),
        (2, None),
        (None, "length"),
    ]
    assert _run([(0, _ev(1)), (0, GenerationError("boom"))]) == [(1, None), "generation"]
    assert _run([(0, _ev(1)), (0, StopAsyncIteration)]) == [
        (1, None),
        "incomplete_generation_stream",
    ]
    assert _run([(0, GenerationError("bad", "validation"))]) == ["validation"]


def test_tokens_are_not_delayed_by_pairing():
    """Each token is handed over as soon as it arrives, not when the next one does."""

    async def go():
        stream = _Stream([(0, _ev(1)), (0.3, _ev(2)), (0, _completion("x", "length"))])
        seen = []
        start = asyncio.get_running_loop().time()
        async for ev, _ in paired(stream):
            seen.append((ev.index, asyncio.get_running_loop().time() - start))
        return seen

    seen = asyncio.run(go())
    assert seen[0][0] == 1 and seen[0][1] < 0.1


def test_a_consumer_leaving_after_the_stream_ended_leaves_no_unretrieved_task():
    """The peek for the next item may finish (the stream ended) after paired() handed over
    a token and before its consumer closed it (a tool call cut short): its exception is
    retrieved, so asyncio logs no "Task exception was never retrieved"."""
    import gc

    async def go():
        reported = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        pairs = paired(_Stream([(0, _ev(1)), (0.05, StopAsyncIteration)]))
        assert (await anext(pairs))[0].index == 1
        await asyncio.sleep(0.1)  # the peek ends with StopAsyncIteration meanwhile
        await pairs.aclose()
        del pairs
        gc.collect()
        await asyncio.sleep(0)
        return reported

    assert asyncio.run(go()) == []


def test_error_helpers():
    assert json.loads(errors.overloaded().response().body) == {
        "error": "Model is overloaded",
        "error_type": "overloaded",
    }
    assert errors.from_generation_error(GenerationError("x", "shutdown")).status == 503
    assert errors.from_generation_error(GenerationError("oom")).message == (
        "Request failed during generation: oom"
    )
    with pytest.raises(PlainError, match="missing field `inputs`"):
        Fields({}, "GenerateRequest").required("inputs", "str")
    with pytest.raises(PlainError, match=r"a\.b: invalid type: boolean `true`, expected u32"):
        Fields({"b": True}, "X", "a").optional("b", "u32")
