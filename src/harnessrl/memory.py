"""The process's host memory: glibc's arena limit (and, on request, its mmap threshold) set in
process, freed memory handed back to the system, the resident size a training step reports, and
a sampler of a call's peak above it.

glibc gives each thread that contends for the heap an arena of its own, up to 8 per core; a
trainer's rollout, sandbox and torch threads each fill one with a step's short-lived buffers,
and freed arena pages stay with the process. A training process reached 16 GB resident that
way; ``MALLOC_ARENA_MAX=2`` kept it bounded, and ``limit_malloc_arenas`` sets the same limit
from inside the process, so nobody has to remember the variable. Everything here is a no-op
off glibc; no module here imports torch (the command line calls it before anything starts
threads).
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
import threading
import time

M_ARENA_MAX = -8  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
ARENA_LIMIT = 2  # what MALLOC_ARENA_MAX=2 set: measured to keep a training process bounded
MMAP_THRESHOLD = 2**20  # bytes: a block this large or larger gets pages of its own (fix_mmap_threshold)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_arenas_limited: bool | None = None


def _glibc() -> ctypes.CDLL | None:
    """Returns glibc, or None where the C library is another (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(limit: int = ARENA_LIMIT) -> bool:
    """Caps glibc's malloc arenas at ``limit`` for this process (``mallopt(M_ARENA_MAX)``), once;
    returns whether the cap is in force.

    Call it early, before threads allocate: arenas made before the call stay. A
    ``MALLOC_ARENA_MAX`` the user set is respected (glibc has applied it already; it wins).
    Later calls return the first call's answer; off glibc, False."""
    global _arenas_limited
    if _arenas_limited is None:
        libc = _glibc()
        if libc is None:
            _arenas_limited = False
        elif os.environ.get("MALLOC_ARENA_MAX"):
            _arenas_limited = False  # the user's own setting stands
        else:
            _arenas_limited = bool(libc.mallopt(M_ARENA_MAX, int(limit)))
    return _arenas_limited


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Makes glibc map every block of ``threshold`` bytes or more on pages of its own, handed
    back to the system when freed (``mallopt(M_MMAP_THRESHOLD)``); returns whether it is in
    force.

    glibc starts at 128 kB but raises its threshold to the size of each mapped block freed, up
    to 32 MB, so after the first step a step's activations (a few MB each) come from the heap,
    which fragments. A fixed threshold stops the raising: on the quick preset's warm-start steps
    the peak fell 1.32x (4.8 -> 3.6 GB) but the CPU time rose 1.33x, each new block being fresh
    zeroed pages (10x the page faults; `benchmarks/bench_warm_start.py`, docs/benchmarks.md), so
    nothing calls it by default: a run short of memory may call it first. A
    ``MALLOC_MMAP_THRESHOLD_`` the user set is respected; off glibc, False."""
    libc = _glibc()
    if libc is None or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))


def release_freed_memory() -> bool:
    """Returns the host memory freed objects left in the C allocator to the system (glibc's
    ``malloc_trim``); True when some was returned.

    A CPU update step allocates gigabytes of activations in chunks small enough for glibc's
    heap, frees them, and glibc keeps the pages: a training process then holds its peak for the
    rest of its life (the quick preset's update peaks near 10 GB with 6,144-token micro-batches),
    and a second process on the machine can be killed for memory the first no longer uses. A
    no-op (False) off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    gc.collect()
    return bool(libc.malloc_trim(0))


def rss_mb() -> float:
    """Returns this process's resident memory now, in MiB (``/proc/self/statm``); the peak
    (``peak_rss_mb``) where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """Returns this process's peak resident memory so far, in MiB (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class PeakRSS:
    """Samples this process's resident memory every ``interval_s`` on a thread while the
    ``with`` block runs; ``extra_mb`` is then its peak above the RSS at entry (what one call
    needed on top of what was there: ``peak_rss_mb`` cannot say it once an earlier call peaked
    higher). The benchmarks of memory use it around the call they measure."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s, self.start_mb, self.peak_mb = interval_s, 0.0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak_mb = max(self.peak_mb, rss_mb())
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self.start_mb = self.peak_mb = rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, rss_mb())

    @property
    def extra_mb(self) -> float:
        return self.peak_mb - self.start_mb
