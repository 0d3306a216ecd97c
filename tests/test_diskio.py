"""Atomic writes from more than one process at once: `--jobs 2` experiment workers both write
the shared ``experiment.json``. With one fixed temporary name, one worker's rename took the
other's temporary file away and that worker died with ``No such file or directory`` (CI,
2026-12-03); each write now has a temporary file of its own."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

from harnessrl.diskio import write_text_atomic

WRITES = 300


def _write_many(path: str, worker: int, errors) -> None:
    try:
        for n in range(WRITES):
            write_text_atomic(path, json.dumps({"worker": worker, "n": n, "pad": "x" * 4096}))
    except OSError as exc:  # the failure this test is about
        errors.put(f"worker {worker}: {exc}")


def test_two_processes_writing_one_file_both_finish_and_leave_a_whole_file(tmp_path):
    path = tmp_path / "experiment.json"
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    workers = [context.Process(target=_write_many, args=(str(path), worker, errors)) for worker in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    assert [w.exitcode for w in workers] == [0, 0]
    last = json.loads(path.read_text(encoding="utf-8"))  # whole: one writer's last record
    assert last["n"] == WRITES - 1 and last["worker"] in (0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.json"]  # no temporary left
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644

