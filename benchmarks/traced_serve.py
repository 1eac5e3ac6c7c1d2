"""`python -m tgix.serve` with its memory watched from inside, for telling a leak from caches.

    TGIX_MEMORY_TRACE=path.jsonl [TGIX_TRACEMALLOC=4] python -m benchmarks.traced_serve ARGS

Runs the launcher unchanged in this process, plus a thread that appends one JSON line every
10 s: RSS, what glibc's malloc holds (`mallinfo2`: `in_use` bytes handed out, `free` bytes
kept in its heaps, `mmapped` large blocks), Python's allocated block count, and with
TGIX_TRACEMALLOC=N (frames per trace, traced from the load's start on) the bytes tracemalloc
sees. RSS rising while `in_use`
and the block count stay level is the allocator keeping freed memory (fragmentation), not a
leak; `in_use` rising with the block count level is native memory (XLA, tokenizers).

Signals (sent by `benchmarks.soak --trace`): SIGUSR1 marks the start of the load (tracemalloc
starts there: what it sees at the end is what the load allocated and kept); SIGUSR2 its end:
a snapshot, the 25 sites whose live allocations grew most since the start, then
`malloc_trim(0)` and the RSS before and after it (how much of the RSS was free memory glibc
had kept).

Diagnostic only: a tracemalloc snapshot holds the GIL for about a second.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from server.heap import release_freed_heap, rss_mib


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def sample(start: float) -> dict:
    info = LIBC.mallinfo2()
    row = {
        "t": round(time.monotonic() - start, 1),
        "rss_mib": round(rss_mib() or float("nan"), 1),
        "malloc_in_use_mib": round(info.uordblks / 2**20, 1),
        "malloc_free_mib": round(info.fordblks / 2**20, 1),
        "malloc_mmapped_mib": round(info.hblkhd / 2**20, 1),
        "python_blocks": sys.getallocatedblocks(),
    }
    if tracemalloc.is_tracing():
        row["traced_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
    return row


class Tracer(threading.Thread):
    def __init__(self, path: str, frames: int):
        super().__init__(daemon=True, name="memory-trace")
        self.path, self.frames, self.start_t = path, frames, time.monotonic()
        self.marks: list[str] = []
        self.first: tracemalloc.Snapshot | None = None
        self.wake = threading.Event()

    def mark(self, name: str) -> None:
        self.marks.append(name)
        self.wake.set()

    def write(self, row: dict) -> None:
        with open(self.path, "a") as out:
            out.write(json.dumps(row) + "\n")

    def on_mark(self, name: str) -> None:
        if name == "start" and self.frames:
            tracemalloc.start(self.frames)  # not earlier: tracing slows start-up's tracing 2x
        row = {"mark": name, **sample(self.start_t)}
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            if self.first is None:
                self.first = snapshot
            else:
                stats = snapshot.compare_to(self.first, "traceback")[:25]
                row["growth"] = [
                    {
                        "kib": round(s.size_diff / 1024, 1),
                        "blocks": s.count_diff,
                        "at": [f"{f.filename}:{f.lineno}" for f in s.traceback],
                    }
                    for s in stats
                ]
        if name == "end":
            before, after = release_freed_heap() or (float("nan"),) * 2
            row["rss_before_trim_mib"], row["rss_after_trim_mib"] = (
                round(before, 1),
                round(after, 1),
            )
        self.write(row)

    def run(self) -> None:
        while True:
            self.wake.wait(10.0)
            self.wake.clear()
            while self.marks:
                self.on_mark(self.marks.pop(0))
            self.write(sample(self.start_t))


def summarise(path: str, slope, warmup_s: float = 60) -> dict:
    """The trace file as soak figures: each series' slope (MiB or blocks per minute) over
    the load after its warm-up and over its second half, the trim and the growth sites."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    start = next((r["t"] for r in rows if r.get("mark") == "start"), 0.0)
    end = next((r for r in rows if r.get("mark") == "end"), {})
    load = [r for r in rows if "mark" not in r and start + warmup_s <= r["t"] <= end.get("t", 1e12)]
    out: dict = {}
    for key in ("rss_mib", "malloc_in_use_mib", "malloc_free_mib", "python_blocks", "traced_mib"):
        series = [(r["t"], r[key]) for r in load if key in r]
        if series:
            out[f"{key}_first_last"] = (series[0][1], series[-1][1])
            out[f"{key}_slope_per_min"] = round(slope(series), 3)
            out[f"{key}_slope_second_half_per_min"] = round(slope(series[len(series) // 2 :]), 3)
    for key in ("rss_before_trim_mib", "rss_after_trim_mib", "growth"):
        if key in end:
            out[key] = end[key]
    return out


def main() -> None:
    frames = int(os.environ.get("TGIX_TRACEMALLOC", "0"))
    tracer = Tracer(os.environ["TGIX_MEMORY_TRACE"], frames)
    tracer.start()
    signal.signal(signal.SIGUSR1, lambda *_: tracer.mark("start"))
    signal.signal(signal.SIGUSR2, lambda *_: tracer.mark("end"))
    sys.argv = ["tgix.serve", *sys.argv[1:]]
    runpy.run_module("tgix.serve", run_name="__main__")


if __name__ == "__main__":
    main()
