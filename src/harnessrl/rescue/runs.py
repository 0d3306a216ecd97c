"""Rollouts for the pool's own measurements: one policy, several harnesses, the same tasks, and
the pass table they give (task -> passed, per harness and run).

Evolution, validation, the compliance check and the pool analysis all measure through
``run_grid``, so they share seeds: run r of every harness uses seed ``seed + r``. Given a
journal file, ``run_grid`` appends each episode to it as it ends and does not run again the
episodes it already holds, so a measurement cut short (a session's end, a kill) resumes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harnessrl.diskio import write_text_atomic
from harnessrl.harness.harness import Harness
from harnessrl.policy.base import Policy
from harnessrl.rollout.engine import RolloutJob
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory, iter_jsonl, save_jsonl

JobKey = tuple[str, int, str, int]  # harness key, run, task id, seed


def run_grid(
    policy: Policy, harnesses: Sequence[tuple[str, Harness]], tasks: Sequence[Task], settings: RolloutSettings, runs: int = 1,
    journal: str | Path | None = None,
) -> dict[str, list[Trajectory]]:
    """Runs every task ``runs`` times under every harness; returns trajectories by the given
    harness key (run r uses seed ``settings.seed + r``). ``journal``: a JSONL file that keeps
    each finished episode; the episodes it already holds are taken from it, not run again (the
    caller makes sure it was written by the same policy and settings: `open_journal`)."""
    jobs = [
        RolloutJob(task, harness, seed=settings.seed + run, tags={"key": key, "run": run})
        for key, harness in harnesses for task in tasks for run in range(runs)
    ]
    if not jobs:
        return {}
    done = read_journal(journal) if journal is not None else {}
    todo = [job for job in jobs if _job_key(job) not in done]
    if todo:
        keep = None if journal is None else (lambda _index, trajectory: save_jsonl([trajectory], journal, append=True))
        trajectories, _ = settings.engine(policy, on_trajectory=keep).run(todo)
        done.update({_job_key(job): trajectory for job, trajectory in zip(todo, trajectories, strict=True)})
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for job in jobs:
        out[str(job.tags["key"])].append(done[_job_key(job)])
    return dict(out)


def _job_key(job: RolloutJob) -> JobKey:
    return str(job.tags["key"]), int(job.tags["run"]), job.task.id, job.seed


def read_journal(path: str | Path) -> dict[JobKey, Trajectory]:
    """Returns the episodes a `run_grid` journal holds, by job. A last line cut short by a kill
    is cut off the file (appends then start on a whole line); any other bad line is an error."""
    path = Path(path)
    if not path.is_file():
        return {}
    with path.open("r+b") as handle:
        size = handle.seek(0, 2)
        if size and (handle.seek(size - 1), handle.read(1))[1] != b"\n":  # a torn last line
            handle.seek(0)
            handle.truncate(handle.read().rfind(b"\n") + 1)
    done: dict[JobKey, Trajectory] = {}
    for trajectory in iter_jsonl(path):
        tags = trajectory.metrics
        if "tag_key" not in tags or "tag_run" not in tags:
            raise ValueError(f"{path}: an episode of {trajectory.task_id} without its job's tags: not a run_grid journal")
        done[(str(tags["tag_key"]), int(tags["tag_run"]), trajectory.task_id, trajectory.seed)] = trajectory
    return done


def open_journal(path: str | Path, fingerprint: dict[str, Any]) -> Path:
    """Returns the journal ``path`` for a measurement described by ``fingerprint`` (JSON-able:
    policy, tasks, settings, harnesses), kept beside it as ``<name>.json``. A journal of the
    same measurement is resumed; a finished one of another measurement is replaced; an
    unfinished one of another measurement is refused, naming what differs."""
    path = Path(path)
    meta = path.with_suffix(".json")
    wanted = json.loads(json.dumps(fingerprint))
    held = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else None
    if held is not None and held["fingerprint"] == wanted:
        return path
    if held is not None and not held.get("finished"):
        changed = sorted(k for k in set(held["fingerprint"]) | set(wanted) if held["fingerprint"].get(k) != wanted.get(k))
        raise ValueError(f"{path} holds the episodes of an unfinished measurement with other options "
                         f"({', '.join(changed)}); resume with the same options, or remove {path} and {meta.name} "
                         "to start again")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # episodes without their fingerprint cannot be trusted
    write_text_atomic(meta, json.dumps({"fingerprint": wanted, "finished": False}, indent=2))
    return path


def finish_journal(path: str | Path) -> None:
    """Marks the journal's measurement finished: another measurement may then replace it."""
    meta = Path(path).with_suffix(".json")
    held = json.loads(meta.read_text(encoding="utf-8"))
    write_text_atomic(meta, json.dumps({**held, "finished": True}, indent=2))


def pass_table(trajectories: Sequence[Trajectory]) -> dict[str, bool]:
    """Returns task -> whether any of its trajectories passed."""
    table: dict[str, bool] = {}
    for t in trajectories:
        table[t.task_id] = table.get(t.task_id, False) or bool(t.passed)
    return table


def pass_rate(table: dict[str, bool]) -> float:
    return sum(table.values()) / len(table) if table else 0.0
