"""A training process's resident memory stays flat across steps: `harnessrl train` on the tiny
model, run as a user runs it (its own process, no MALLOC_ARENA_MAX), records `memory/rss_mb`
after every step, and the later steps' trend must stay under a stated bound."""

import itertools
import json
import statistics
import subprocess

import pytest

pytest.importorskip("torch", reason="torch is installed by `make test`")
pytest.importorskip("transformers", reason="transformers is installed by `make test`")

from checkpoint_helpers import train_command, train_env, write_run_config

STEPS = 14
SETTLED = 4  # steps 0-3 fill what fills once (the checkpoint writer, the first shapes' kernels)
# Two bounds on the settled steps. A leak grows RSS at every step: the median step-to-step
# growth must stay under MAX_STEP_GROWTH_MB (the loop on its own: 0.0 here, RSS rounded to
# 0.1 MB, slope 0.015; half a megabyte kept per step fails it). The least-squares slope catches
# a leak that grows only at some steps; its bound leaves room for one jump (glibc taking a new
# heap region once). A tiny model's step holds little, so these guard the loop at the scale of
# half a megabyte per step; the 135M model's figures come from benchmarks/bench_memory.py.
MAX_STEP_GROWTH_MB = 0.25
MAX_SLOPE_MB_PER_STEP = 1.0


def ls_slope(ys: list[float]) -> float:
    """Returns the least-squares slope of ``ys`` against 0, 1, 2, ..."""
    xs = range(len(ys))
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


def test_ls_slope_is_the_growth_per_step():
    assert ls_slope([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0)
    assert ls_slope([5.0, 5.0, 5.0]) == 0.0


def test_resident_memory_stays_flat_across_training_steps(tiny_model, tmp_path):
    # One task under one configuration: every step's prompts have the same shapes, so the
    # oneDNN kernels cached per matrix shape (~0.5 MB each, bounded at 1,024 per cache, and
    # filled by every new prompt length of a run that varies them) are all made in step 0.
    overrides = {
        "model": str(tiny_model), "steps": STEPS, "design": "single", "k": 1, "max_train_tasks": 1,
        "tasks_per_step": 1, "group_size": 4, "max_turns": 1, "max_new_tokens": 8, "sft_warm_start_steps": 0,
        "eval_base": False, "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False,
        "learning_rate": 1e-3, "temperature": 1.0, "seed": 5, "save_every": 5, "keep_checkpoints": 1,
    }
    run_dir = tmp_path / "run"
    config = write_run_config(tmp_path / "run.yaml", overrides)
    env = train_env()
    env.pop("MALLOC_ARENA_MAX", None)  # the trainer bounds its arenas itself
    out = subprocess.run(train_command(config, run_dir), env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rss = [r["memory/rss_mb"] for r in records]
    assert len(rss) == STEPS and all(value > 0 for value in rss)
    assert all(r["memory/peak_rss_mb"] >= r["memory/rss_mb"] for r in records)
    settled = rss[SETTLED:]
    step_growth = statistics.median(b - a for a, b in itertools.pairwise(settled))
    slope = ls_slope(settled)
    where = f"over steps {SETTLED}-{STEPS - 1} (RSS per step, MB: {rss})"
    assert step_growth <= MAX_STEP_GROWTH_MB, f"RSS grows {step_growth:.2f} MB at a typical step {where}"
    assert slope <= MAX_SLOPE_MB_PER_STEP, f"RSS grows {slope:.2f} MB per step {where}"
    print(f"RSS per step (MB): {rss}; median growth {step_growth:.2f}, slope {slope:.3f}")
