"""benchmarks/gpu_check.sh parses, and its dry run (a tiny Qwen3-shaped model on the CPU) prints every figure's line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is installed by `make test`")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_gpu_check_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_gpu_check_dry_run_prints_one_line_per_figure():
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("gpu_check: ")]
    names = [line.split(": ")[1] for line in lines]
    assert names == ["quick preset", "model", "rollout HFPolicy.generate batch 4", "rollout model.generate batch 4",
                     "rollout vLLM batch 4", "update step", "update MFU"]
    for line in lines[2:4] + lines[5:6]:
        assert float(line.split(": ")[2].split()[0]) > 0, line  # a measured rate, not a placeholder
    assert "--preset quick --device cuda --set dtype=bfloat16" in lines[0]


def test_gpu_check_refuses_an_unknown_flag():
    result = subprocess.run(["bash", str(SCRIPT), "--fast"], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr
