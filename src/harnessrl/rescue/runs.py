"""Rollouts for the pool's own measurements: one policy, several harnesses, the same tasks, and
the pass table they give (task -> passed, per harness and run).

Evolution, validation, the compliance check and the pool analysis all measure through
``run_grid``, so they share seeds: run r of every harness uses seed ``seed + r``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from harnessrl.harness.harness import Harness
from harnessrl.policy.base import Policy
from harnessrl.rollout.engine import RolloutJob
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


def run_grid(
    policy: Policy, harnesses: Sequence[tuple[str, Harness]], tasks: Sequence[Task], settings: RolloutSettings, runs: int = 1,
) -> dict[str, list[Trajectory]]:
    """Runs every task ``runs`` times under every harness; returns trajectories by the given
    harness key (run r uses seed ``settings.seed + r``)."""
    jobs = [
        RolloutJob(task, harness, seed=settings.seed + run, tags={"key": key, "run": run})
        for key, harness in harnesses for task in tasks for run in range(runs)
    ]
    if not jobs:
        return {}
    trajectories, _ = settings.engine(policy).run(jobs)
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for job, trajectory in zip(jobs, trajectories, strict=True):
        out[str(job.tags["key"])].append(trajectory)
    return dict(out)


def pass_table(trajectories: Sequence[Trajectory]) -> dict[str, bool]:
    """Returns task -> whether any of its trajectories passed."""
    table: dict[str, bool] = {}
    for t in trajectories:
        table[t.task_id] = table.get(t.task_id, False) or bool(t.passed)
    return table


def pass_rate(table: dict[str, bool]) -> float:
    return sum(table.values()) / len(table) if table else 0.0
