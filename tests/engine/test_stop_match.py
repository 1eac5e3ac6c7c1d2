"""Stop matching is linear: the KMP matcher agrees with brute force on random texts, and the
structures built for a stop of n characters grow as n (1k, 10k, 100k characters), where the
set of every prefix it replaces grew as n^2 (1.3 GB for one 60,000-character stop)."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from tgix.engine.request import TokenInfo
from tgix.engine.stop_match import StopMatcher, failure_table
from tgix.engine.stops import StopBuffer

_ALPHABET = st.text("abc", min_size=1, max_size=6)


def _brute_first_match(stops: list[str], text: str):
    for end in range(1, len(text) + 1):
        done = [s for s in stops if s and text[:end].endswith(s)]
        if done:
            return max(done, key=len), end
    return None


def _brute_partial(stops: list[str], text: str) -> int:
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(stops=st.lists(_ALPHABET, min_size=1, max_size=4), pieces=st.lists(_ALPHABET, max_size=8))
def test_matcher_agrees_with_brute_force(stops, pieces):
    matcher, text = StopMatcher(stops), ""
    for piece in pieces:
        match = matcher.feed(piece)
        want = _brute_first_match(stops, text + piece)
        if match is not None:
            stop, offset = match
            assert want == (stop, len(text) + offset)
            return
        text += piece
        assert want is None
        assert matcher.partial == _brute_partial(stops, text)


def _peak_bytes(build) -> int:
    failure_table.cache_clear()
    tracemalloc.start()
    try:
        kept = build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return peak


def _stream_near_matches(n: int) -> StopBuffer:
    stop = "ab" * (n // 2 - 1) + "c"  # self-overlapping, and "abab..." never completes it
    buffer = StopBuffer([stop, stop[:-1] + "x"])
    for _ in range(2 * n // 80):  # near-matches: at most n characters stay held
        buffer.push(TokenInfo(1, "ab" * 40, -1.0, False))
    assert len(buffer.held) * 80 <= n + 80
    return buffer


def test_a_stops_structures_grow_linearly():
    peaks = {}
    for n in (1_000, 10_000, 100_000):
        peaks[n] = _peak_bytes(lambda n=n: _stream_near_matches(n))
    assert peaks[10_000] < 15 * peaks[1_000] and peaks[100_000] < 15 * peaks[10_000], peaks
    assert peaks[100_000] < 64 * 100_000, peaks  # bytes per stop character, all included
