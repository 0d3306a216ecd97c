"""A full disk (issue 30, item 4), made real: a size-limited tmpfs mounted in a user and mount
namespace (``unshare -rm``), so every write below meets the kernel's own ``ENOSPC``.

Before the fix, `save_jsonl` left ``rollouts/step-000001.jsonl`` cut at 8,192 bytes (the text
buffer's size) and the trainer died with a bare ``OSError: [Errno 28]`` traceback; now a file
holds whole lines or none, a failed checkpoint leaves no half-written folder, and `harnessrl
train` ends with one line that names the run folder, the space left and needed, and where the
same command resumes, which it then does once there is room.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkpoint_helpers import write_run_config
from harnessrl.diskio import DiskFull, append_text, is_disk_full, write_text_atomic

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _unshare_works(), reason="needs user namespaces to mount a small tmpfs")


def on_small_disk(folder: Path, size: str, script: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Runs the shell ``script`` with a tmpfs of ``size`` mounted at ``folder`` ($DISK)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS, os.environ.get("PYTHONPATH", "")]),
           "DISK": str(folder), "OMP_NUM_THREADS": "1"}
    wrapped = f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(folder))} && {script}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", wrapped], env=env, capture_output=True, text=True,
                          timeout=timeout)


def python(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(textwrap.dedent(code))}"


def test_jsonl_and_metrics_keep_whole_lines_on_a_full_disk(tmp_path: Path) -> None:
    code = """
        import json, os
        from pathlib import Path
        from harnessrl.diskio import DiskFull
        from harnessrl.trajectory import Trajectory, load_jsonl, save_jsonl
        from harnessrl.diskio import append_text
        disk = Path(os.environ["DISK"])
        trajectories = [Trajectory(task_id=f"t{i}", config="S0", harness="S0", answer="x" * 3000) for i in range(40)]
        save_jsonl(trajectories[:4], disk / "kept.jsonl")
        with open(disk / "filler", "wb") as handle:  # leave about 20 KiB
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            handle.write(b"0" * max(0, free - 20 * 1024))
        report = {}
        for name, call in (("new", lambda: save_jsonl(trajectories, disk / "step-000001.jsonl")),
                           ("append", lambda: save_jsonl(trajectories, disk / "kept.jsonl", append=True)),
                           ("metrics", lambda: append_text(disk / "kept.jsonl", "y" * 64 * 1024 + "\\n"))):
            try:
                call()
                report[name] = "written"
            except DiskFull as exc:
                report[name] = str(exc)
        report["new_exists"] = (disk / "step-000001.jsonl").exists()
        report["tmp_left"] = sorted(p.name for p in disk.iterdir() if p.name.startswith("."))
        report["kept"] = [t.task_id for t in load_jsonl(disk / "kept.jsonl")]
        print(json.dumps(report))
    """
    done = on_small_disk(tmp_path / "disk", "1m", python(code))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("new", "append", "metrics"):
        assert report[name].startswith(f"no space left on the device of {tmp_path / 'disk'}"), report
        assert "free" in report[name] and "needed" in report[name]
    assert report["new_exists"] is False and report["tmp_left"] == []  # no prefix, no temporary file
    assert report["kept"] == ["t0", "t1", "t2", "t3"]  # the old lines, whole, and nothing else


def test_a_training_run_on_a_full_disk_says_where_and_resumes_once_there_is_room(tiny_model, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    run_dir = disk / "run"
    config = write_run_config(tmp_path / "run.yaml", {
        "model": str(tiny_model), "steps": 2, "tasks_per_step": 1, "group_size": 2,
        "max_turns": 1, "max_new_tokens": 8, "max_train_tasks": 8, "sft_warm_start_steps": 0,
        "eval_tasks": 1, "eval_held_out": 1, "eval_out_of_space": False, "micro_batch_tokens": 4096,
        "seed": 3, "save_every": 1, "keep_checkpoints": 1, "deterministic": True,
    })
    train = (f"{shlex.quote(sys.executable)} -m harnessrl.cli train --config {shlex.quote(str(config))}"
             f" --run-dir {shlex.quote(str(run_dir))}")
    # 1 MiB: the run starts, and its step-0 checkpoint (a tokenizer of 2 MiB alone) cannot be written
    script = (f"{train} > $DISK/../first.out 2> $DISK/../first.err; echo $? > $DISK/../first.rc;"
              f" ls -a {shlex.quote(str(run_dir / 'checkpoints'))} > $DISK/../left.txt 2>&1;"
              f" mount -o remount,size=256m $DISK && {train} --resume > $DISK/../second.out 2>&1; echo $?")
    done = on_small_disk(disk, "1m", script)
    first_err = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first_err
    assert f"harnessrl train: error: no space left on the device of {run_dir}" in first_err
    assert "resumes from the start" in first_err and "needed" in first_err
    assert "Traceback" not in first_err, first_err
    assert ".tmp-step-000000" not in (tmp_path / "left.txt").read_text()  # no half checkpoint kept
    second = (tmp_path / "second.out").read_text()
    assert done.stdout.strip().splitlines()[-1] == "0", second[-3000:]
    assert "Traceback" not in second


def test_disk_full_is_recognised_through_wrapping_and_other_errors_are_not(tmp_path: Path) -> None:
    full = OSError(28, "No space left on device")
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("SafetensorError: I/O error: No space left on device (os error 28)") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(PermissionError(13, "Permission denied"))
    assert not is_disk_full(None)
    error = DiskFull(tmp_path / "absent" / "deeper", needed=3 * 1024 * 1024, hint="free some")
    assert str(error).startswith(f"no space left on the device of {tmp_path / 'absent' / 'deeper'} (")
    assert "3.0 MiB needed" in str(error) and str(error).endswith(": free some")
    write_text_atomic(tmp_path / "a.txt", "one\n")
    append_text(tmp_path / "a.txt", "two\n")
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\n"
