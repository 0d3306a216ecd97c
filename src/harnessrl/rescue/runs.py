"""Rollouts for the pool's own measurements: one policy, several harnesses, the same tasks, and
the pass table they give (task -> passed, per harness and run).

Evolution, validation, the compliance check and the pool analysis all measure through
``run_grid``, so they share seeds: run r of every harness uses seed ``seed + r``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from harnessrl.harness.harness import Harness, HarnessLimits
from harnessrl.policy.base import Policy, SamplingParams
from harnessrl.rollout.engine import EngineOptions, RolloutEngine, RolloutJob
from harnessrl.tasks.model import Task
from harnessrl.trajectory import Trajectory


@dataclass(frozen=True)
class RunSettings:
    """How Harness-S's own rollouts run (the pool's measurements, paired validation, routed
    evaluation): limits, sampling (``max_new_tokens`` None: the limits' own), sandbox backend,
    and the engine's concurrency (defaults: `EngineOptions`'s)."""

    limits: HarnessLimits = field(default_factory=HarnessLimits)
    temperature: float = 0.0
    seed: int = 0
    backend: str = "auto"
    max_concurrent: int = EngineOptions.max_concurrent
    env_workers: int = EngineOptions.env_workers
    progress: bool = False  # the episodes' progress on stderr (harnessrl.progress)
    max_new_tokens: int | None = None

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens or self.limits.max_new_tokens)

    def engine(self, policy: Policy) -> RolloutEngine:
        """Returns a rollout engine over ``policy`` with these settings."""
        return RolloutEngine(policy, max_concurrent=self.max_concurrent, env_workers=self.env_workers,
                             sampling=self.sampling(), backend=self.backend, progress=self.progress)


def run_grid(
    policy: Policy, harnesses: Sequence[tuple[str, Harness]], tasks: Sequence[Task], settings: RunSettings, runs: int = 1,
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
