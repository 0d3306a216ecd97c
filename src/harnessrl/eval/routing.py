"""Rank-1 routing at inference against H0 (Harness-S, Table 5 and the Pass@3 / Avg@3 protocol).

Every test task runs k times under H0 and k times under its Rank-1 harness (``rescue.rank1``),
with the same seeds, so the two are paired. Reported: how often H0 itself is Rank-1 (paper:
1.53% before Harness-S training, 22.52% after: the policy needs the siblings less), and the
Rank-1 - H0 margins of Pass@1, pass@k and Avg@k (paper: 14.21 -> 0.76 Pass@3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from harnessrl.eval.metrics import score_runs
from harnessrl.harness.harness import Harness
from harnessrl.policy.base import Policy
from harnessrl.rescue.rank1 import rank1, run_with
from harnessrl.rescue.router import Router, TaskInfo
from harnessrl.rollout.engine import RolloutJob
from harnessrl.rollout.settings import RolloutSettings
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


def routed_evaluation(
    policy: Policy,
    router: Router,
    h0: str,
    siblings: Sequence[str],
    tasks: Sequence[Task],
    k: int,
    settings: RolloutSettings,
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
    trajectories = run_with(policy, settings)(jobs)
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
