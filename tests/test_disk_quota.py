"""A per-episode disk quota (issue 30, item 4): where the host may mount (root), every workspace
`open_sandbox` makes is a size-limited tmpfs (`SandboxLimits.disk_mb`), so an episode that fills
its disk meets `ENOSPC` in its own commands while a neighbour on the same filesystem still
writes, verifies and gets its reward. Shown on a small real filesystem (a 24 MiB tmpfs holding
every workspace): without the quota the filling episode takes the neighbour's room and its
verification fails; with it, the neighbour passes. Where no quota can be mounted, the workspace
says so and a warning names the consequence."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from harnessrl.sandbox import SandboxLimits, open_sandbox
from harnessrl.sandbox.workspace import (
    LOCK_SUFFIX,
    QUOTA_SOURCE,
    STALE_AFTER_S,
    Workspace,
    remove_stale_workspaces,
)
from harnessrl.tasks import Action, FileEquals, Task
from harnessrl.tasks.model import prepare_workspace, verify_task

# CI runs as root and sets HARNESSRL_REQUIRE_SANDBOX_BACKENDS: there these tests fail, not skip.
ROOT = os.geteuid() == 0 or os.environ.get("HARNESSRL_REQUIRE_SANDBOX_BACKENDS") == "1"
BACKENDS = ("bwrap", "unshare")
SRC = str(Path(__file__).resolve().parents[1] / "src")
TASK = Task(id="neighbour", instruction="Write hello to hello.txt.", verifier=FileEquals("hello.txt", "hello"),
            gold=[Action.write("hello.txt", "hello\n")])
FILL = "dd if=/dev/zero of=fill.bin bs=1M count=64 2>&1"


def quota_mounts(path: Path) -> list[str]:
    return [line for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.startswith(QUOTA_SOURCE + " ") and str(path) in line]


@pytest.fixture
def small_disk():
    """A 24 MiB tmpfs in the temporary folder (whose parents the sandbox user can search): a
    filesystem the test can fill without harm."""
    disk = Path(tempfile.mkdtemp(prefix="harnessrl-small-disk-"))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(b"small-disk", str(disk).encode(), b"tmpfs", 0, b"size=24m,mode=0755") == 0, \
        os.strerror(ctypes.get_errno())
    try:
        yield disk
    finally:
        libc.umount2(str(disk).encode(), 2)
        disk.rmdir()


def neighbour_passes(disk: Path, backend: str, disk_mb: int) -> tuple[bool, str]:
    """Runs a filling episode and, beside it on ``disk``, an episode that does its task; returns
    whether the neighbour's verification passed and what the filler's command printed."""
    limits = SandboxLimits(disk_mb=disk_mb, file_size_mb=64)
    filler_ws, neighbour_ws = Workspace(base_dir=disk, quota_mb=disk_mb), Workspace(base_dir=disk, quota_mb=disk_mb)
    with open_sandbox(filler_ws, backend=backend, limits=limits) as filler, \
            open_sandbox(neighbour_ws, backend=backend, limits=limits) as neighbour:
        prepare_workspace(TASK, neighbour)
        shown = filler.exec(FILL).stdout
        try:
            neighbour.write_file("hello.txt", "hello\n")
        except Exception as exc:  # the disk is full: the neighbour's work is lost
            shown += f"\nneighbour: {exc}"
        passed = verify_task(TASK, neighbour).passed
    filler_ws.close()
    neighbour_ws.close()
    return passed, shown


@pytest.mark.skipif(not ROOT, reason="mounting the test's small filesystem needs root (CI runs as root)")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_disk_costs_the_filling_episode_only(small_disk: Path, backend: str) -> None:
    unbounded, _ = neighbour_passes(small_disk, backend, disk_mb=0)
    assert not unbounded  # no quota: the filler took the neighbour's room, and its reward
    bounded, shown = neighbour_passes(small_disk, backend, disk_mb=8)
    assert bounded, shown
    assert "No space left on device" in shown  # the filler's own error observation
    assert quota_mounts(small_disk) == [] and sorted(p.name for p in small_disk.iterdir()) == []


@pytest.mark.skipif(not ROOT, reason="the quota is a tmpfs mount: root only (the warning branch is tested below)")
def test_a_killed_owners_quota_mount_is_removed_by_the_next_start(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from harnessrl.sandbox.workspace import Workspace
        ws = Workspace(base_dir=sys.argv[1], quota_mb=4)
        print(ws.quota_applied, flush=True)
        time.sleep(120)
    """), str(tmp_path)], env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "True"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert len(quota_mounts(tmp_path)) == 1  # a SIGKILL removes nothing
    past = time.time() - 2 * STALE_AFTER_S
    for lock in tmp_path.glob(f"*{LOCK_SUFFIX}"):
        os.utime(lock, (past, past))
    assert remove_stale_workspaces(tmp_path) == 1
    assert quota_mounts(tmp_path) == [] and list(tmp_path.iterdir()) == []


def test_where_no_quota_can_be_mounted_the_workspace_says_so(tmp_path: Path, monkeypatch, caplog) -> None:
    from harnessrl.sandbox import workspace as module

    monkeypatch.setattr(module.os, "geteuid", lambda: 1000)  # as an unprivileged user would be
    monkeypatch.setattr(module, "_quota_warned", False)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        ws = Workspace(base_dir=tmp_path, quota_mb=4)
    assert not ws.quota_applied and "no per-episode disk quota" in caplog.text and quota_mounts(tmp_path) == []
    ws.close()
    kept = Workspace(base_dir=tmp_path, quota_mb=4, keep=True)  # a kept workspace outlives any mount
    assert not kept.quota_applied
    with pytest.raises(ValueError, match="disk_mb"):
        SandboxLimits(disk_mb=-1)
