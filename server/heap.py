"""Handing the C heap's free memory back to the system once start-up is done.

Compiling every step shape allocates and frees gigabytes through glibc's malloc, and glibc
keeps the freed memory in its arenas: measured on the default server (`benchmarks.soak
--trace`), 1.5 GiB of an 11.7 GiB RSS was free heap that serving never reused (`malloc_trim`
took RSS to 10.2 GiB while the bytes in use stayed level). On a shared machine that is memory
another process could have. Where malloc_trim does not exist (musl, macOS) nothing happens.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger("tgix.server")


def rss_mib(pid: int | str = "self") -> float | None:
    """A process's resident set in MiB (Linux /proc; this one by default), else None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def release_freed_heap() -> tuple[float, float] | None:
    """malloc_trim(0): RSS in MiB before and after, or None where there is no such call."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    before = rss_mib()
    trim(0)
    after = rss_mib()
    if before is None or after is None:
        return None
    log.info("returned %.0f MiB of freed heap to the system (RSS %.0f MiB)", before - after, after)
    return before, after
