"""benchmarks/bench_memory.py measures what a process tree takes from the machine: a page that a
forked child shares with its parent counts once in the PSS figure (the peak it reports), twice in
the RSS sum it reports beside it as an upper bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_memory.py"

# 300 MB of touched pages, then a fork: the child shares them all (it never writes them) while
# both sleep; the parent waits for it.
FORKS = r"""
import os, time
block = bytearray(300 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
child = os.fork()
if child == 0:
    time.sleep(2.5)
    os._exit(0)
os.waitpid(child, 0)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="PSS needs Linux's smaps_rollup")
def test_a_forked_childs_shared_pages_count_once(tmp_path):
    out = tmp_path / "memory.json"
    run = subprocess.run([sys.executable, str(BENCH), "--interval", "0.2", "--every", "0", "--json", str(out),
                          "--", sys.executable, "-c", FORKS], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    mib = 2**20
    assert result["measure"] == "PSS", result
    assert 300 * mib <= result["peak_bytes"] < 450 * mib, result  # the block once, plus two interpreters
    assert result["peak_rss_bytes"] >= 600 * mib, result  # the block in each process
    assert "peak PSS:" in run.stdout and "peak RSS:" in run.stdout
