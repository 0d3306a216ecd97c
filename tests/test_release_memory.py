"""A training process bounds its host memory itself: glibc's arenas capped in process (no
MALLOC_ARENA_MAX needed; the mmap threshold fixed on request), and the memory of a finished step
handed back to the system (without it, a CPU update step's freed activations stay with the C
allocator for the life of the process)."""

import os
import subprocess
import sys
import time

import pytest

CHILD = r"""
import torch
from harnessrl.memory import release_freed_memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

# Chunks below glibc's mmap threshold live on its heap, like a step's many small activations;
# the last chunk stays allocated, so the heap's top cannot shrink on its own.
chunks = [torch.ones(16_000) for _ in range(6_000)]  # ~64 kB each, ~380 MB in all
keep = torch.ones(16_000)
del chunks
before = rss_mb()
released = release_freed_memory()
after = rss_mb()
print(released, round(before), round(after))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_step_memory_goes_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    released, before, after = out.stdout.split()
    assert released == "True"
    assert float(before) - float(after) > 200, out.stdout  # most of the ~380 MB freed came back



ARENAS = r"""
import ctypes, sys, threading
from harnessrl.memory import limit_malloc_arenas

limited = limit_malloc_arenas() if sys.argv[1] == "limit" else False
libc = ctypes.CDLL("libc.so.6")
blocks, together = [], threading.Barrier(8)
def allocate():  # a live thread's first malloc takes an arena of its own, up to the limit
    blocks.append(ctypes.create_string_buffer(4096))
    together.wait()  # all 8 alive at once: none hands its arena on to the next
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.open_memstream.restype = ctypes.c_void_p
buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(limited, buffer.value.decode().count("<heap nr="))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc arenas are glibc's")
@pytest.mark.parametrize("mode", ["limit", "default"])
def test_threads_share_two_arenas_once_limited_in_process(mode):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, timeout=120,
                         check=True, env=env)
    limited, heaps = out.stdout.split()
    if mode == "limit":
        assert limited == "True" and int(heaps) <= 2, out.stdout
    else:  # without the limit glibc gives each of the 8 threads an arena: what it would cost
        assert int(heaps) > 2, out.stdout


def test_a_users_malloc_arena_max_is_left_in_force():
    env = {**os.environ, "MALLOC_ARENA_MAX": "4"}
    code = "from harnessrl.memory import limit_malloc_arenas; print(limit_malloc_arenas())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_peak_rss_sees_what_a_block_needed_above_its_start():
    """``PeakRSS`` reports a block's peak above the memory at its start, from samples taken while
    it runs: 200 MB touched then freed inside counts; what was there before does not."""
    from harnessrl.memory import PeakRSS

    held = bytearray(100 * 2**20)  # there before the block: not the block's
    with PeakRSS(interval_s=0.001) as peak:
        inside = bytearray(200 * 2**20)  # fresh mapped pages: zero, not resident until written
        inside[::4096] = b"\x01" * len(range(0, len(inside), 4096))  # one write per page
        time.sleep(0.1)  # the sampler (every 1 ms) runs while this thread waits
        del inside
    assert 150 < peak.extra_mb < 400, peak.extra_mb
    with PeakRSS() as idle:
        pass
    assert idle.extra_mb < 50
    del held


MMAP = r'''
import ctypes, sys
from harnessrl.memory import fix_mmap_threshold

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
fixed = fix_mmap_threshold() if sys.argv[1] == "fixed" else False
SIZE = 4 * 2**20
libc.free(libc.malloc(SIZE))  # mapped; freeing it raises glibc's own threshold above 4 MB
blocks, pins = [], []
for _ in range(100):  # a step's activations: ~400 MB of 4-MB blocks, each touched
    block = libc.malloc(SIZE)
    libc.memset(block, 1, SIZE)
    blocks.append(block)
    pins.append(libc.malloc(256 * 2**10))  # kept, too large for a free bin: it follows the block
before = rss_mb()
for block in blocks:
    libc.free(block)
print(fixed, round(before - rss_mb()))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mmap threshold is glibc's")
@pytest.mark.parametrize("mode", ["fixed", "default"])
def test_a_fixed_mmap_threshold_hands_freed_activations_back_at_once(mode):
    """With the threshold fixed (``fix_mmap_threshold``, on request), blocks of a few MB are
    mapped on their own pages and go back to the system when freed; with glibc's default, the first
    freed block raises the threshold and the rest stay on the heap after they are freed (the
    C allocator's own blocks: torch's placement of small tensors would decide the heap's top)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", MMAP, mode], capture_output=True, text=True, timeout=120,
                         check=True, env=env)
    fixed, returned = out.stdout.split()
    if mode == "fixed":
        assert fixed == "True" and int(returned) > 350, out.stdout
    else:
        assert int(returned) < 50, out.stdout


def test_a_users_mmap_threshold_is_left_in_force():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    code = "from harnessrl.memory import fix_mmap_threshold; print(fix_mmap_threshold())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=env)
    assert out.stdout.strip() == "False"
