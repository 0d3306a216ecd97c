"""Rank-1 routing (Harness-S, eq. 12) and the paired validation routers are anchored on.

``rank1``: per task, before it runs, the router's first choice among H0 and its siblings. A
sibling becomes Rank-1 only when the router's evidence prefers it to H0; on a tie H0 is kept,
since nothing says a sibling would help. ``paired_validation``: every harness once per
validation task with the same seeds, the evidence of validation routing (``eval/routing.py``
compares Rank-1 against H0 at inference; ``rl/rescue.py`` re-anchors during training).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harnessrl.harness.harness import Harness
from harnessrl.policy.base import Policy
from harnessrl.rescue.router import PairedValidation, Router, TaskInfo
from harnessrl.rollout.engine import RolloutJob
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


def rank1(router: Router, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> str:
    """Returns the Rank-1 harness for ``task``: the router's best sibling when its score beats
    H0's, else H0 (validation routing scores H0 at 0 against itself)."""
    ranking = router.rank(task, h0, list(siblings), seed)
    if not ranking:
        return h0
    best = ranking[0]
    return best if router.beats_h0(task, h0, best) else h0


def run_with(policy: Policy, settings: RolloutSettings) -> RunJobs:
    """Returns a job runner over ``policy`` with these settings."""
    return lambda jobs: _run(policy, jobs, settings)


def _run(policy: Policy, jobs: list[RolloutJob], settings: RolloutSettings) -> list[Trajectory]:
    return settings.engine(policy).run(jobs)[0] if jobs else []


RunJobs = Callable[[list[RolloutJob]], list[Trajectory]]


def paired_validation(
    run_jobs: RunJobs, harness_of: Callable[[str], Harness], harnesses: Sequence[str], tasks: Sequence[Task],
    seed_of: Callable[[int], int], step: int = 0, keep: dict[str, dict[str, Trajectory]] | None = None,
) -> PairedValidation:
    """Returns each harness's outcome on each validation task: one run each, with the same
    seed for a task under every harness (``seed_of(task index)``), so the comparison is paired.
    ``keep`` receives the trajectories (harness -> task id -> trajectory), e.g. for profiles."""
    jobs = [RolloutJob(task, harness_of(name), seed=seed_of(i), tags={"harness": name})
            for name in harnesses for i, task in enumerate(tasks)]
    record = PairedValidation(families={t.id: t.family for t in tasks}, step=step)
    for job, trajectory in zip(jobs, run_jobs(jobs), strict=True):
        record.outcomes.setdefault(job.tags["harness"], {})[job.task.id] = bool(trajectory.passed)
        if keep is not None:
            keep.setdefault(job.tags["harness"], {})[job.task.id] = trajectory
    return record
