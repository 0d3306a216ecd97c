"""Progress wherever a person waits, on a terminal or not: off a terminal (a log file,
``nohup``, CI) ``harnessrl.progress`` writes timestamped lines to stderr, a heartbeat keeps a
slow step from being silent, and the commands that wait use it."""

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (?P<desc>[\w -]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+) \(", re.M)


def lines(text: str) -> list[tuple[str, int, int]]:
    return [(m["desc"], int(m["done"]), int(m["total"])) for m in LINE.finditer(text)]


def cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs the command line with stderr a pipe (not a terminal) and a line per update."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HARNESSRL_PROGRESS_S": "0"}
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_off_a_terminal_each_update_is_a_timestamped_line():
    stream = io.StringIO()
    with Progress(3, "episodes", "ep", stream=stream, every_s=0) as progress:
        for _ in range(3):
            progress.update(1, tok_s="1.0")
        progress.note("PASS task-1")
    text = stream.getvalue()
    assert lines(text) == [("episodes", 0, 3), ("episodes", 1, 3), ("episodes", 2, 3), ("episodes", 3, 3)]
    assert "tok_s 1.0" in text and "PASS task-1\n" in text


def test_a_heartbeat_line_comes_while_nothing_finishes():
    stream = io.StringIO()
    progress = Progress(2, "train", "step", stream=stream, every_s=0.01)
    try:
        for _ in range(500):  # waits for the timer's lines; no update happens meanwhile
            if len(lines(stream.getvalue())) >= 3:
                break
            time.sleep(0.01)
    finally:
        progress.close()
    assert len(lines(stream.getvalue())) >= 3 and all(done == 0 for _, done, _ in lines(stream.getvalue()))


def test_disabled_progress_writes_nothing():
    stream = io.StringIO()
    with Progress(2, "x", stream=stream, enabled=False) as progress:
        progress.update(2)
    assert stream.getvalue() == ""


def test_tasks_check_shows_progress_without_a_terminal():
    result = cli("tasks", "check", "--suite", "workspace", "--split", "test", "--limit", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("check", 2, 2) in lines(result.stderr), result.stderr[-2000:]


def test_rollout_and_eval_show_episode_progress_without_a_terminal(tmp_path):
    result = cli("rollout", "--policy", "oracle", "--configs", "S0-T0-O0-C0-W0", "--limit", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("episodes", 2, 2) in lines(result.stderr), result.stderr[-2000:]
    result = cli("eval", "--policy", "oracle", "--configs", "S1-T1-O1-C1-W1", "--limit", "2",
                 "--out", str(tmp_path / "eval"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("episodes", 2, 2) in lines(result.stderr), result.stderr[-2000:]


def test_training_shows_its_steps_and_episodes_without_a_terminal(tiny_model, tmp_path, capfd):
    from harnessrl.rl.config import load_config
    from harnessrl.rl.loop import train

    overrides = {
        "model": str(tiny_model), "run_dir": str(tmp_path / "run"), "steps": 2, "tasks_per_step": 1,
        "group_size": 2, "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 4, "sft_warm_start_steps": 1,
        "sft_tasks": 1, "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False, "seed": 3,
    }
    os.environ["HARNESSRL_PROGRESS_S"] = "0"
    try:
        train(load_config(preset="quick", overrides=overrides), log=lambda message: None)
    finally:
        del os.environ["HARNESSRL_PROGRESS_S"]
    seen = lines(capfd.readouterr().err)
    assert ("train", 2, 2) in seen and ("sft", 1, 1) in seen
    assert any(desc == "episodes" for desc, _, _ in seen)  # the base evaluation and the rollouts


def test_external_run_prints_each_task_as_it_finishes(tmp_path):
    from harnessrl.external.agents import get_agent
    from harnessrl.external.install import AgentInstallError, require_installed

    try:
        require_installed("mini-swe-agent", get_agent("mini-swe-agent").plan())
    except AgentInstallError:
        pytest.skip("mini-swe-agent is not installed: run `harnessrl external install mini-swe-agent`")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "external", "run", "mini-swe-agent", "--limit", "2",
         "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    first = process.stdout.readline()
    running_after_first = process.poll() is None  # the second task is still running
    rest = process.stdout.read()
    assert process.wait(timeout=600) == 0
    assert re.match(r"^\[\d\d:\d\d:\d\d\] 1/2 (PASS|FAIL) ", first), first
    assert running_after_first
    assert re.search(r"^\[\d\d:\d\d:\d\d\] 2/2 (PASS|FAIL) ", rest, re.M) and "pass_rate" in rest


def test_pool_runs_show_episode_progress_without_a_terminal(tmp_path):
    pool = tmp_path / "pool"
    assert cli("pool", "from-space", "--base", "S0-T0-O0-C0-W0", "--out", str(pool)).returncode == 0
    result = cli("pool", "check", str(pool), "--limit", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert any(desc == "episodes" and done == total for desc, done, total in lines(result.stderr)), result.stderr[-2000:]
