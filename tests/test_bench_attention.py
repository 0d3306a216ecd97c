"""benchmarks/bench_decode_attention.py and bench_prefill_attention.py run the C++ attention kernels
against SDPA on the same inputs and check their outputs against SDPA's before printing a ratio."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

ROOT = Path(__file__).resolve().parents[1]


def run_bench(name: str, *args: str) -> str:
    if shutil.which("c++") is None:  # as tests/test_decode_kernel.py: CI has one
        if os.environ.get("CI"):
            pytest.fail("no C++ compiler: the attention kernels cannot be built")
        pytest.skip("no C++ compiler (`make setup` installs g++ where it can)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_the_prefill_benchmark_compares_the_kernel_with_transformers_sdpa_path():
    out = run_bench("bench_prefill_attention.py", "--shapes", "5x5,7x70,33x300", "--repeats", "1")
    assert len(re.findall(r"^S=\s*\d+ L=\s*\d+: .* \| ratio \d+\.\d\d$", out, re.MULTILINE)) == 3, out
    assert float(re.search(r"largest difference: (\S+)", out).group(1)) <= 1e-4
    assert re.search(r"^ratio: \d+\.\d\d$", out.splitlines()[-1]), out


def test_the_decode_benchmark_compares_the_kernel_with_sdpa():
    out = run_bench("bench_decode_attention.py", "--rows", "2", "--columns", "300", "--repeats", "1")
    assert float(re.search(r"largest difference: (\S+)", out).group(1)) <= 5e-5
    assert re.search(r"^ratio: \d+\.\d\d$", out.splitlines()[-1]), out
