"""Rank-1 routing at inference (Harness-S, eq. 12): per task, before it runs, the router's first
choice among H0 and its siblings; the task is rolled out under that harness.

The comparison the paper reports (Table 5): how often H0 itself is Rank-1 (1.53% before
Harness-S training, 22.52% after: the policy needs the siblings less), and the Pass@k / Avg@k
of Rank-1 routing against H0 on the same tasks and runs (margin 14.21 -> 0.76). A sibling
becomes Rank-1 only when the router's evidence prefers it to H0; on a tie H0 is kept, since
nothing says a sibling would help.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.eval.metrics import score_runs
from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.rescue.router import Router, TaskInfo, ValidationRecord, ValidationRouter
from harnessrl.rollout.engine import RolloutEngine, RolloutJob
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


def rank1(router: Router, task: TaskInfo, h0: str, siblings: Sequence[str], seed: int) -> str:
    """Returns the Rank-1 harness for ``task``: the router's best sibling when its score beats
    H0's, else H0 (validation routing scores H0 at 0 against itself)."""
    ranking = router.rank(task, h0, list(siblings), seed)
    if not ranking:
        return h0
    best = ranking[0]
    if isinstance(router, ValidationRouter):
        score = router.scores(task, h0, [best])[best]
        return best if score > 0.0 else h0
    return best


@dataclass
class EngineSettings:
    """How routed evaluation rolls out: limits, sampling and the engine's concurrency."""

    limits: HarnessLimits
    temperature: float = 0.0
    max_new_tokens: int = 384
    max_concurrent: int = 16
    env_workers: int = 4
    backend: str = "auto"


def run_with(policy: Policy, settings: EngineSettings) -> RunJobs:
    """Returns a job runner over ``policy`` with these settings."""
    return lambda jobs: _run(policy, jobs, settings)


def _run(policy: Policy, jobs: list[RolloutJob], settings: EngineSettings) -> list[Trajectory]:
    engine = RolloutEngine(
        policy, max_concurrent=settings.max_concurrent, env_workers=settings.env_workers,
        sampling=SamplingParams(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens),
        backend=settings.backend,
    )
    return engine.run(jobs)[0] if jobs else []


RunJobs = Callable[[list[RolloutJob]], list[Trajectory]]


def paired_validation(
    run_jobs: RunJobs, harness_of: Callable[[str], Harness], harnesses: Sequence[str], tasks: Sequence[Task],
    seed_of: Callable[[int], int], step: int = 0,
) -> ValidationRecord:
    """Returns each harness's outcome on each validation task: one run each, with the same
    seed for a task under every harness (``seed_of(task index)``), so the comparison is paired."""
    jobs = [RolloutJob(task, harness_of(name), seed=seed_of(i), tags={"harness": name})
            for name in harnesses for i, task in enumerate(tasks)]
    record = ValidationRecord(families={t.id: t.family for t in tasks}, step=step)
    for job, trajectory in zip(jobs, run_jobs(jobs), strict=True):
        record.outcomes.setdefault(job.tags["harness"], {})[job.task.id] = bool(trajectory.passed)
    return record


def routed_evaluation(
    policy: Policy,
    router: Router,
    h0: str,
    siblings: Sequence[str],
    tasks: Sequence[Task],
    k: int,
    settings: EngineSettings,
    seed: int = 0,
    on_trajectories: Callable[[list[Trajectory]], None] | None = None,
) -> dict[str, Any]:
    """Rolls every task out k times under H0 and k times under its Rank-1 harness (the same
    seeds: runs of a task under the two are paired) and returns the comparison: Pass@1,
    pass@k and Avg@k of each, the Rank-1 - H0 margins, the share of tasks for which H0 is
    Rank-1, and how often each sibling is chosen."""
    choice = {task.id: rank1(router, TaskInfo.of(task), h0, siblings, seed) for task in tasks}
    built = {name: Harness.named(name, settings.limits) for name in {h0, *choice.values()}}
    jobs = [RolloutJob(task, built[name], seed=seed + run, tags={"arm": arm, "run": run})
            for arm, names in (("h0", {t.id: h0 for t in tasks}), ("rank1", choice))
            for task in tasks for name in [names[task.id]] for run in range(k)]
    trajectories = _run(policy, jobs, settings)
    if on_trajectories is not None:
        on_trajectories(trajectories)
    runs: dict[str, dict[str, list[bool]]] = {"h0": {}, "rank1": {}}
    for job, trajectory in zip(jobs, trajectories, strict=True):
        runs[job.tags["arm"]].setdefault(job.task.id, []).append(bool(trajectory.passed))
    scores = {arm: score_runs(list(by_task.values()), k, seed=seed) for arm, by_task in runs.items()}
    margin = {key: (None if scores["rank1"][key] is None or scores["h0"][key] is None
                    else scores["rank1"][key] - scores["h0"][key]) for key in ("pass_at_1", "pass_at_k", "avg_at_k")}
    chosen = Counter(choice.values())
    return {
        "h0": h0, "siblings": list(siblings), "router": router.name, "k": k, "tasks": len(tasks),
        "h0_rank1_share": chosen.get(h0, 0) / len(tasks) if tasks else 0.0,
        "rank1_counts": dict(sorted(chosen.items())), "choice": choice,
        "under_h0": scores["h0"], "under_rank1": scores["rank1"], "margin": margin,
    }
