"""Episode workspaces a stopped run leaves behind (issue 30, item 7): a command ended by SIGTERM
removes its workspaces (before the fix the process died at once and left them in the
temporary folder), and one ended by SIGKILL, which can remove nothing, leaves workspaces whose
locks nobody holds, which the next trainer's start removes; a live run's are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harnessrl.sandbox.workspace import (
    LOCK_SUFFIX,
    STALE_AFTER_S,
    Workspace,
    remove_stale_workspaces,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")
CHILD = textwrap.dedent("""
    import signal, sys, time
    from harnessrl.cli import _terminated
    from harnessrl.sandbox.workspace import Workspace
    signal.signal(signal.SIGTERM, _terminated)  # what `harnessrl <command>` installs
    workspaces = [Workspace(base_dir=sys.argv[1]) for _ in range(3)]
    print("ready", flush=True)
    time.sleep(120)
""")


def start_child(base: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(base)], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def left(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


def test_sigterm_removes_the_workspaces_of_the_process(tmp_path: Path) -> None:
    child = start_child(tmp_path)
    assert len(left(tmp_path)) == 6  # three workspaces, three locks beside them
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
    assert left(tmp_path) == []


def test_after_sigkill_the_next_start_removes_what_was_left_and_nothing_live(tmp_path: Path) -> None:
    child = start_child(tmp_path)
    child.kill()
    child.wait(timeout=60)
    stale = left(tmp_path)
    assert len(stale) == 6
    live = Workspace(base_dir=tmp_path)  # this process's: held, never removed
    (live.root / "work.txt").write_text("mine")
    assert remove_stale_workspaces(tmp_path) == 0  # just left: could be a run taking its lock
    past = time.time() - 2 * STALE_AFTER_S
    for name in [*stale, live.root.name + LOCK_SUFFIX]:
        os.utime(tmp_path / name, (past, past))
    assert remove_stale_workspaces(tmp_path) == 3
    assert left(tmp_path) == sorted([live.root.name, live.root.name + LOCK_SUFFIX])
    assert (live.root / "work.txt").read_text() == "mine"
    live.close()
    assert left(tmp_path) == []


def test_a_kept_workspace_has_no_lock_and_is_never_swept(tmp_path: Path) -> None:
    kept = Workspace(base_dir=tmp_path, keep=True)
    kept.close()
    assert left(tmp_path) == [kept.root.name]
    assert remove_stale_workspaces(tmp_path) == 0 and kept.root.exists()


def test_the_command_line_ends_on_sigterm_as_on_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    from harnessrl import cli
    from harnessrl.cli import design as design_cli

    seen = []
    monkeypatch.setattr(design_cli, "run_design", lambda args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["design"]) == 0
    assert seen == [cli._terminated]  # while the command runs
    assert signal.getsignal(signal.SIGTERM) is before  # and given back after it
